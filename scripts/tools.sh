# Sourced by the scripts: installs the Debian packages they need when a tool is missing
# and we are root on a machine with apt-get, else says what is missing.
#   need TOOL=PACKAGE ...      (a path such as /usr/lib/cni/bridge counts as a tool)
# Returns non-zero, naming the missing packages, when it cannot install them.
need() {
  local missing=() pair tool pkg
  for pair in "$@"; do
    tool=${pair%%=*}
    pkg=${pair#*=}
    case $tool in
      /*) [ -x "$tool" ] || missing+=("$pkg") ;;
      *) command -v "$tool" >/dev/null 2>&1 || missing+=("$pkg") ;;
    esac
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing: ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  else
    echo "missing tools: ${missing[*]} (run as root on Debian to install them)" >&2
    return 1
  fi
}

# What the build needs beyond Rust: make and a C compiler (aws-lc, jemalloc).
BUILD_TOOLS=(make=make cc=gcc)
# The fuzz crate's seed tests: libfuzzer-sys builds libFuzzer, which is C++.
FUZZ_TOOLS=(c++=g++)
# The tools the end-to-end tests use.
NETNS_TOOLS=(ip=iproute2 iptables=iptables ipset=ipset tcpdump=tcpdump iperf3=iperf3 curl=curl dig=dnsutils /usr/lib/cni/bridge=containernetworking-plugins)
# The demo's: nodes, capture rules, ipsets, the CNI plugins, and tcpdump to show the wire.
DEMO_TOOLS=(ip=iproute2 iptables=iptables ipset=ipset tcpdump=tcpdump dig=dnsutils /usr/lib/cni/bridge=containernetworking-plugins)
# The interop suite's: namespaces, capture rules, ipsets and the CNI plugins.
INTEROP_TOOLS=(ip=iproute2 iptables=iptables ipset=ipset /usr/lib/cni/bridge=containernetworking-plugins)
# The test API server's client suites: kubectl and Python's kubernetes client (a
# directory counts as present when it exists).
KUBE_TOOLS=(kubectl=kubernetes-client /usr/lib/python3/dist-packages/kubernetes=python3-kubernetes)
