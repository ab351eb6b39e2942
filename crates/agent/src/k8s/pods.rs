//! Kubernetes objects to the reconcile's view, sans IO.

use std::net::IpAddr;

use ambit_k8s::annotation::redirection_of;
use ambit_k8s::k8s_openapi::api::core::v1::Pod;
use ambit_k8s::PodFacts;

use super::reconcile::PodView;
use super::settings::K8sConfig;

/// `status.podIPs` (else `status.podIP`), unmapped, without duplicates; unparsable ones
/// are skipped.
pub fn pod_ips(pod: &Pod) -> Vec<IpAddr> {
    let Some(status) = pod.status.as_ref() else {
        return Vec::new();
    };
    let listed: Vec<&str> = match status.pod_ips.as_ref().filter(|v| !v.is_empty()) {
        Some(ips) => ips.iter().map(|p| p.ip.as_str()).collect(),
        None => status.pod_ip.iter().map(String::as_str).collect(),
    };
    let mut out = Vec::new();
    for ip in listed.iter().filter_map(|s| s.parse::<IpAddr>().ok()) {
        let ip = ip.to_canonical();
        if !out.contains(&ip) {
            out.push(ip);
        }
    }
    out
}

/// The reconcile's view of `pod` (`None` without a UID, which the API always sets).
pub fn view(pod: &Pod, cfg: &K8sConfig) -> Option<PodView> {
    let uid = pod.metadata.uid.clone().filter(|u| !u.is_empty())?;
    let facts = PodFacts::of(pod);
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    Some(PodView {
        uid,
        name: pod.metadata.name.clone().unwrap_or_default(),
        namespace: facts.namespace.clone(),
        service_account: pod
            .spec
            .as_ref()
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_else(|| "default".into()),
        ips: pod_ips(pod),
        terminal: matches!(phase, Some("Succeeded" | "Failed")),
        annotation: redirection_of(pod),
        ztunnel: cfg.is_ztunnel(&facts.namespace, &facts.labels),
        facts,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ambit_k8s::annotation::Redirection;

    fn pod(json: serde_json::Value) -> Pod {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn a_pod_as_the_api_server_sends_it() {
        let cfg = K8sConfig::from_lookup(|_| None, "n").unwrap();
        let p = pod(serde_json::json!({
            "metadata": {"name": "web", "namespace": "shop", "uid": "u1",
                         "labels": {"app": "web"},
                         "annotations": {"ambient.istio.io/redirection": "pending"}},
            "spec": {"serviceAccountName": "web-sa", "nodeName": "n", "containers": []},
            "status": {"phase": "Running", "podIP": "10.0.0.9",
                       "podIPs": [{"ip": "10.0.0.1"}, {"ip": "::ffff:10.0.0.1"}, {"ip": "fd00::1"}, {"ip": "bad"}]}
        }));
        let v = view(&p, &cfg).unwrap();
        assert_eq!(
            (v.uid.as_str(), v.name.as_str(), v.namespace.as_str()),
            ("u1", "web", "shop")
        );
        assert_eq!(v.service_account, "web-sa");
        assert_eq!(
            v.ips,
            vec![
                "10.0.0.1".parse::<IpAddr>().unwrap(),
                "fd00::1".parse().unwrap()
            ]
        );
        assert!(!v.terminal && !v.ztunnel);
        assert_eq!(v.annotation, Some(Redirection::Pending));

        let p = pod(serde_json::json!({
            "metadata": {"name": "z", "namespace": "istio-system", "uid": "u2", "labels": {"app": "ztunnel"}},
            "status": {"phase": "Succeeded", "podIP": "10.0.0.9"}
        }));
        let v = view(&p, &cfg).unwrap();
        assert!(v.terminal && v.ztunnel);
        assert_eq!(v.service_account, "default");
        assert_eq!(v.ips, vec!["10.0.0.9".parse::<IpAddr>().unwrap()]);
        assert!(view(&Pod::default(), &cfg).is_none());
    }
}
