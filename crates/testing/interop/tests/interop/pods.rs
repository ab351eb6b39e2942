//! A node with pods and no agent: a node namespace with a bridge, pod namespaces on it,
//! the in-pod capture rules written here from the reference (istio-cni §2.1, DNS capture
//! off), and a node proxy in shared mode that an agent peer of the test's choosing serves.

use std::io::Write;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use ambit_interop::NodeProxy;
use ambit_netns_lab::{Lab, Process};
use anyhow::{bail, Context};

pub const NODE_NAME: &str = "node1";

pub struct Pod {
    pub name: String,
    pub ns: String,
    pub ip: Ipv4Addr,
    pub uid: String,
}

impl Pod {
    pub fn netns_path(&self) -> PathBuf {
        Lab::netns_path(&self.ns)
    }
}

pub struct PodNode {
    pub lab: Lab,
    pub node_ns: String,
    pub pods: Vec<Pod>,
    pub zds_socket: PathBuf,
    pub config_path: PathBuf,
    pub ca_dir: PathBuf,
}

/// The mesh: each pod an HBONE workload on `NODE_NAME`.
fn mesh_yaml(pods: &[(&str, Ipv4Addr)]) -> String {
    let mut out = String::from("workloads:\n");
    for (name, ip) in pods {
        out.push_str(&format!(
            "- uid: cluster1//v1/Pod/default/{name}\n  name: {name}\n  namespace: default\n  serviceAccount: {name}\n  trustDomain: cluster.local\n  workloadIps: [\"{ip}\"]\n  protocol: HBONE\n  node: {NODE_NAME}\n  canonicalName: {name}\n  services: {{}}\n"
        ));
    }
    out
}

/// istio-cni's in-pod rules without DNS capture, for `iptables-restore --noflush`.
const INPOD_RULES: &str = "*mangle
:ISTIO_PRERT - [0:0]
:ISTIO_OUTPUT - [0:0]
-A PREROUTING -j ISTIO_PRERT
-A OUTPUT -j ISTIO_OUTPUT
-A ISTIO_PRERT -m mark --mark 0x539/0xfff -j CONNMARK --set-xmark 0x111/0xfff
-A ISTIO_OUTPUT -m connmark --mark 0x111/0xfff -j CONNMARK --restore-mark --nfmask 0xffffffff --ctmask 0xffffffff
COMMIT
*nat
:ISTIO_PRERT - [0:0]
:ISTIO_OUTPUT - [0:0]
-A OUTPUT -j ISTIO_OUTPUT
-A PREROUTING -j ISTIO_PRERT
-A ISTIO_PRERT -s 169.254.7.127 -p tcp -m tcp -j ACCEPT
-A ISTIO_OUTPUT -d 169.254.7.127 -p tcp -m tcp -j ACCEPT
-A ISTIO_PRERT ! -d 127.0.0.1/32 -p tcp ! --dport 15008 -m mark ! --mark 0x539/0xfff -j REDIRECT --to-ports 15006
-A ISTIO_OUTPUT -p tcp -m mark --mark 0x111/0xfff -j ACCEPT
-A ISTIO_OUTPUT ! -d 127.0.0.1/32 -o lo -j ACCEPT
-A ISTIO_OUTPUT ! -d 127.0.0.1/32 -p tcp -m mark ! --mark 0x539/0xfff -j REDIRECT --to-ports 15001
COMMIT
";

impl PodNode {
    /// A node namespace with bridge `br0` (10.88.1.1/24) and one pod namespace per name,
    /// 10.88.1.10 upwards, each with the in-pod rules installed.
    pub fn build(tag: &str, names: &[&str], proxies: &[&NodeProxy]) -> anyhow::Result<PodNode> {
        let lab = Lab::new(tag)?;
        let node_ns = lab.netns("node")?;
        for cmd in [
            "ip link add br0 type bridge",
            "ip addr add 10.88.1.1/24 dev br0",
            "ip link set br0 up",
        ] {
            lab.exec(&node_ns, &cmd.split(' ').collect::<Vec<_>>())?;
        }
        let mut pods = Vec::new();
        let mut yaml_pods = Vec::new();
        for (i, name) in names.iter().enumerate() {
            let ip = Ipv4Addr::new(10, 88, 1, 10 + i as u8);
            let ns = lab.netns(&format!("pod-{name}"))?;
            let host_dev = format!("veth{i}");
            lab.exec(
                &node_ns,
                &[
                    "ip", "link", "add", &host_dev, "type", "veth", "peer", "name", "eth0",
                    "netns", &ns,
                ],
            )?;
            lab.exec(
                &node_ns,
                &["ip", "link", "set", &host_dev, "master", "br0", "up"],
            )?;
            lab.exec(
                &ns,
                &["ip", "addr", "add", &format!("{ip}/24"), "dev", "eth0"],
            )?;
            lab.exec(&ns, &["ip", "link", "set", "eth0", "up"])?;
            lab.exec(&ns, &["ip", "route", "add", "default", "via", "10.88.1.1"])?;
            install_inpod_rules(&lab, &ns)?;
            pods.push(Pod {
                name: name.to_string(),
                ns,
                ip,
                uid: format!("uid-{name}-{}", rand::random::<u32>()),
            });
            yaml_pods.push((*name, ip));
        }
        let config_path = lab.dir.path().join("mesh.yaml");
        std::fs::write(&config_path, mesh_yaml(&yaml_pods))?;
        let ca_dir = lab.dir.path().join("ca");
        ambit_netns_lab::peer::write_lab_ca(&ca_dir, proxies)?;
        let zds_socket = lab.dir.path().join("zds.sock");
        Ok(PodNode {
            lab,
            node_ns,
            pods,
            zds_socket,
            config_path,
            ca_dir,
        })
    }

    pub fn pod(&self, name: &str) -> &Pod {
        self.pods
            .iter()
            .find(|p| p.name == name)
            .expect("no such pod")
    }

    /// Starts `proxy` in shared mode in the node namespace, connecting to `zds_socket`.
    pub fn start_proxy(&self, proxy: &NodeProxy) -> anyhow::Result<Process> {
        let mut env = proxy.env(&self.config_path, &self.ca_dir);
        env.extend([
            ("PROXY_MODE", "shared".to_string()),
            ("INPOD_UDS", self.zds_socket.display().to_string()),
            ("NODE_NAME", NODE_NAME.to_string()),
            ("IPV6_ENABLED", "false".to_string()),
        ]);
        let (program, args) = proxy.command();
        self.lab.spawn(
            &self.node_ns,
            &format!("proxy-{}-{}", proxy.label(), rand::random::<u16>()),
            program,
            args,
            &env,
        )
    }

    /// Whether something listens on TCP `port` inside `pod`.
    pub fn listening(&self, pod: &str, port: u16) -> bool {
        let filter = format!("sport = :{port}");
        self.lab
            .exec(&self.pod(pod).ns, &["ss", "-Hltn", &filter])
            .is_ok_and(|o| !o.trim().is_empty())
    }
}

fn install_inpod_rules(lab: &Lab, ns: &str) -> anyhow::Result<()> {
    let mut child = Command::new("ip")
        .args(["netns", "exec", ns, "iptables-restore", "-w", "--noflush"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("running iptables-restore")?;
    child
        .stdin
        .take()
        .context("iptables-restore stdin")?
        .write_all(INPOD_RULES.as_bytes())?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "iptables-restore in {ns}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    for cmd in [
        "ip rule add fwmark 0x111/0xfff pref 32764 lookup 100",
        "ip route replace local 0.0.0.0/0 dev lo table 100",
    ] {
        lab.exec(ns, &cmd.split(' ').collect::<Vec<_>>())?;
    }
    Ok(())
}
