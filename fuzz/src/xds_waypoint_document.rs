//! The `xds_waypoint_document` target: the body of one of the waypoint's own resources
//! (`ambit.waypoint.v1.AuthorizationPolicy`, `Route`, `RequestAuthentication`,
//! `DestinationRule`: a
//! Kubernetes document as written) through its type and a waypoint's delta client.

use ambit_proto::{DeltaDiscoveryResponse, Resource};
use ambit_waypoint_xds::{
    resource_name, AuthnDocuments, DestinationRuleDocuments, DocumentKind, DocumentOp,
    DocumentStore, Documents, PolicyDocuments, RouteDocuments,
};
use ambit_xds::delta::{DeltaClient, Limits, NodeConfig};
use ambit_xds::{Rejection, ResourceType};
use prost::Message;

/// Input: byte 0 picks the type (0 AuthorizationPolicy, 1 Route, 2 RequestAuthentication,
/// 3 DestinationRule, modulo 4); the rest is the body.
///
/// Checks: measuring and decoding never panic; a body decoded is named
/// `<kind>/<namespace>/<name>` after its object, and that object sent again as its own
/// document decodes to it again; through the delta client, the body is accepted only if
/// the type accepted it, and is then held under its name; a refusal is a NACK that names
/// it (with the measure's reason when the measure refused). Returns the name, or the NACK's
/// reason.
pub fn run(data: &[u8]) -> Result<String, String> {
    let (selector, body) = data.split_first().map_or((0, &[][..]), |(s, b)| (*s, b));
    match selector % 4 {
        0 => body_of::<PolicyDocuments>(body),
        1 => body_of::<RouteDocuments>(body),
        2 => body_of::<AuthnDocuments>(body),
        _ => body_of::<DestinationRuleDocuments>(body),
    }
}

fn body_of<K: DocumentKind>(body: &[u8]) -> Result<String, String> {
    let ty = Documents::<K>::default();
    let fixed = format!("{}/ns/fixed", K::KINDS[0]);
    let measured = ty.measure(&fixed, body);
    let decoded = measured.as_ref().ok().map(|_| ty.decode(body));
    let name = match &decoded {
        Some(Ok(d)) => {
            let DocumentOp::Put(v) = &d.op else {
                panic!("a decoded body is a put")
            };
            assert_eq!(d.key, resource_name::<K>(v));
            let wire = K::Message::decode(body).expect("decoded once");
            let manifest = K::fields(wire).3;
            let again = ambit_waypoint_xds::to_proto::<K>(v, &manifest).encode_to_vec();
            let back = ty.decode(&again).expect("its own document decodes");
            assert_eq!(back.op, d.op);
            d.key.clone()
        }
        _ => fixed,
    };
    through_client(
        ty,
        &name,
        body,
        matches!(decoded, Some(Ok(_))),
        measured.as_ref().err(),
    )
}

/// A body named `name` through a waypoint's delta client subscribed to `ty`, with what
/// the type said of it (`decoded`, and the measure's refusal if any).
fn through_client<K: DocumentKind>(
    ty: Documents<K>,
    name: &str,
    body: &[u8],
    decoded: bool,
    measured: Option<&Rejection>,
) -> Result<String, String> {
    let type_url = <Documents<K> as ResourceType>::TYPE_URL;
    let mut client =
        DeltaClient::subscribing(NodeConfig::default().to_node(), Limits::default()).subscribe(ty);
    let h = client.handle(DeltaDiscoveryResponse {
        type_url: type_url.into(),
        nonce: "n".into(),
        resources: vec![Resource {
            name: name.to_string(),
            version: "1".into(),
            resource: Some(prost_types::Any {
                type_url: type_url.into(),
                value: body.to_vec(),
            }),
            ..Default::default()
        }],
        ..Default::default()
    });
    match h.rejected.first() {
        None => {
            assert!(decoded, "accepted what the type refuses");
            let mut store = DocumentStore::<K::Value>::default();
            assert!(h.batch.try_apply(&mut store).is_ok());
            assert_eq!(store.len(), 1, "{name} accepted but not held");
            Ok(name.to_string())
        }
        Some((n, reason)) => {
            assert_eq!(n, name);
            assert!(h.batch.is_empty());
            let message = h.reply.error_detail.expect("a NACK").message;
            assert!(message.starts_with(name));
            if let Some(e) = measured {
                assert_eq!(e, reason);
            }
            Err(reason.to_string())
        }
    }
}
