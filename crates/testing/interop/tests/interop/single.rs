//! One node proxy alone in a namespace, dedicated mode, for what needs no traffic.

use std::time::Duration;

use ambit_interop::NodeProxy;
use ambit_netns_lab::{http_get, wait_until, Lab, Process};

pub struct Single {
    /// Removes the namespace and the proxy when the test is done with them.
    _lab: Lab,
    pub ns: String,
    pub proxy: Process,
}

impl Single {
    /// Starts `proxy` on `mesh` serving `workload` (`namespace/name/service-account`) on
    /// node `node1`, with `env` added; returns once it reports ready.
    pub fn start(
        proxy: &NodeProxy,
        tag: &str,
        mesh: &str,
        workload: &str,
        env: &[(&str, String)],
    ) -> Single {
        let lab = Lab::new(tag).unwrap();
        let ns = lab.netns("node").unwrap();
        let config = lab.dir.path().join("mesh.yaml");
        std::fs::write(&config, mesh).unwrap();
        let ca = lab.dir.path().join("ca");
        ambit_netns_lab::peer::write_lab_ca(&ca, &[proxy]).unwrap();
        let mut vars = proxy.env(&config, &ca);
        vars.extend([
            ("PROXY_MODE", "dedicated".to_string()),
            ("PROXY_WORKLOAD_INFO", workload.to_string()),
            ("NODE_NAME", "node1".to_string()),
        ]);
        vars.extend(env.iter().cloned());
        let (program, args) = proxy.command();
        let p = lab
            .spawn(
                &ns,
                &format!("proxy-{}", proxy.label()),
                program,
                args,
                &vars,
            )
            .unwrap();
        let ready = wait_until("the proxy to be ready", Duration::from_secs(20), || {
            !lab.is_running(p.pid)
                || matches!(
                    http_get(&ns, "127.0.0.1:15021".parse().unwrap(), "/healthz/ready"),
                    Ok((200, _))
                )
        });
        if ready.is_err() || !lab.is_running(p.pid) {
            panic!(
                "{} did not become ready; its log:\n{}",
                proxy.label(),
                std::fs::read_to_string(&p.log).unwrap_or_default()
            );
        }
        Single {
            _lab: lab,
            ns,
            proxy: p,
        }
    }

    pub fn get(&self, path: &str, port: u16) -> String {
        let (status, body) = http_get(&self.ns, ([127, 0, 0, 1], port).into(), path).unwrap();
        assert_eq!(
            status,
            200,
            "GET {path}: {body}\nproxy log:\n{}",
            std::fs::read_to_string(&self.proxy.log).unwrap_or_default()
        );
        body
    }

    pub fn config_dump(&self) -> serde_json::Value {
        serde_json::from_str(&self.get("/config_dump", 15000)).unwrap()
    }
}
