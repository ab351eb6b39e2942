//! The plugin's side of Istio's plugin → agent call (istio-cni reference §4.2):
//! `POST /cmdadd` (Host `unix`) over `<cni_agent_run_dir>/pluginevent.sock`, a JSON body
//! with Go's default field names, 200 = the pod is captured, anything else = refused with
//! the reason as the body.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Map, Value};

use crate::istio_api::{encode_mask, CMDADD_PATH as PATH};
pub use crate::istio_api::{CmdAddRequest, IpConfig, IpNet};

/// Istio's client timeout for the whole call.
pub const TIMEOUT: Duration = Duration::from_secs(5);
/// Largest reply body kept (it is an error text).
pub const MAX_REPLY_BYTES: usize = 64 * 1024;

/// `prevResult.ips` in the request's shape. `Err` says which entry is wrong.
pub fn ips_of(prev: &Map<String, Value>) -> Result<Vec<IpConfig>, String> {
    let list = match prev.get("ips") {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(a)) => a,
        Some(_) => return Err("prevResult.ips must be a list".into()),
    };
    let mut out = Vec::with_capacity(list.len());
    for (i, e) in list.iter().enumerate() {
        let addr = e
            .get("address")
            .and_then(Value::as_str)
            .ok_or_else(|| format!("prevResult.ips[{i}] has no \"address\" string"))?;
        let net: ipnet::IpNet = addr
            .trim()
            .parse()
            .map_err(|_| format!("prevResult.ips[{i}].address {addr:?} is not in CIDR notation"))?;
        let gateway = match e.get("gateway") {
            None | Some(Value::Null) => String::new(),
            Some(Value::String(g)) if g.is_empty() => String::new(),
            Some(Value::String(g)) => g
                .parse::<IpAddr>()
                .map_err(|_| format!("prevResult.ips[{i}].gateway {g:?} is not an IP address"))?
                .to_string(),
            Some(_) => return Err(format!("prevResult.ips[{i}].gateway must be a string")),
        };
        let interface = match e.get("interface") {
            None | Some(Value::Null) => None,
            Some(v) => Some(
                v.as_i64()
                    .ok_or_else(|| format!("prevResult.ips[{i}].interface must be an integer"))?,
            ),
        };
        out.push(IpConfig {
            interface,
            address: IpNet {
                ip: net.addr().to_string(),
                mask: encode_mask(net.addr(), net.prefix_len()),
            },
            gateway,
        });
    }
    Ok(out)
}

/// Why the call failed.
#[derive(Debug, thiserror::Error)]
pub enum CmdAddError {
    #[error("cannot connect to the node agent at {socket}: {error}")]
    Connect {
        socket: PathBuf,
        error: std::io::Error,
    },
    #[error("the node agent at {socket} did not answer within {TIMEOUT:?}")]
    Timeout { socket: PathBuf },
    #[error("HTTP with the node agent at {socket} failed: {error}")]
    Http { socket: PathBuf, error: String },
    #[error("the node agent at {socket} refused the pod ({status}): {body}")]
    Refused {
        socket: PathBuf,
        status: u16,
        body: String,
    },
}

impl CmdAddError {
    /// Refused (the agent answered) rather than unreachable.
    pub fn is_refusal(&self) -> bool {
        matches!(self, CmdAddError::Refused { .. })
    }
}

/// Sends `req` to the agent at `socket`, on the current tokio runtime.
pub async fn call(socket: &Path, req: &CmdAddRequest) -> Result<(), CmdAddError> {
    match tokio::time::timeout(TIMEOUT, call_inner(socket, req)).await {
        Ok(r) => r,
        Err(_) => Err(CmdAddError::Timeout {
            socket: socket.to_owned(),
        }),
    }
}

async fn call_inner(socket: &Path, req: &CmdAddRequest) -> Result<(), CmdAddError> {
    use http_body_util::{BodyExt, Full, Limited};
    use hyper::body::Bytes;

    let http = |error: String| CmdAddError::Http {
        socket: socket.to_owned(),
        error,
    };
    let stream = tokio::net::UnixStream::connect(socket)
        .await
        .map_err(|error| CmdAddError::Connect {
            socket: socket.to_owned(),
            error,
        })?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(|e| http(e.to_string()))?;
    let driver = tokio::spawn(conn);
    let body = serde_json::to_vec(req).map_err(|e| http(e.to_string()))?;
    let request = hyper::Request::post(PATH)
        .header(hyper::header::HOST, "unix")
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| http(e.to_string()))?;
    let resp = sender
        .send_request(request)
        .await
        .map_err(|e| http(e.to_string()))?;
    let status = resp.status().as_u16();
    let body = Limited::new(resp.into_body(), MAX_REPLY_BYTES)
        .collect()
        .await
        .map(|b| String::from_utf8_lossy(&b.to_bytes()).trim().to_owned())
        .unwrap_or_else(|e| format!("(unreadable reply body: {e})"));
    driver.abort();
    if status == 200 {
        Ok(())
    } else {
        Err(CmdAddError::Refused {
            socket: socket.to_owned(),
            status,
            body,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_body_has_gos_field_names_and_masks() {
        let prev = json!({"cniVersion": "1.0.0", "ips": [
            {"address": "10.1.0.5/24", "gateway": "10.1.0.1", "interface": 0},
            {"address": "fd00::5/64"},
        ]});
        let ips = ips_of(prev.as_object().unwrap()).unwrap();
        let req = CmdAddRequest {
            netns: "/var/run/netns/cni-1".into(),
            pod_name: "web-0".into(),
            pod_namespace: "shop".into(),
            ips,
        };
        assert_eq!(
            serde_json::to_value(&req).unwrap(),
            json!({"Netns": "/var/run/netns/cni-1", "PodName": "web-0", "PodNamespace": "shop",
            "IPs": [
              {"Interface": 0, "Address": {"IP": "10.1.0.5", "Mask": "////AA=="}, "Gateway": "10.1.0.1"},
              {"Interface": null, "Address": {"IP": "fd00::5", "Mask": "//////////8AAAAAAAAAAA=="}, "Gateway": ""},
            ]})
        );
    }

    #[test]
    fn bad_ips_say_which_entry() {
        for (ips, want) in [
            (json!([{"address": "nope"}]), "ips[0].address"),
            (json!([{"address": "10.0.0.1/8"}, {}]), "ips[1]"),
            (
                json!([{"address": "10.0.0.1/8", "gateway": "x"}]),
                "gateway",
            ),
            (
                json!([{"address": "10.0.0.1/8", "interface": "eth0"}]),
                "interface",
            ),
            (json!({}), "must be a list"),
        ] {
            let prev = json!({ "ips": ips });
            let err = ips_of(prev.as_object().unwrap()).unwrap_err();
            assert!(err.contains(want), "{err}");
        }
        let v4 = |p| encode_mask("10.0.0.1".parse().unwrap(), p);
        assert_eq!((v4(0).as_str(), v4(17).as_str()), ("AAAAAA==", "//+AAA=="));
    }
}
