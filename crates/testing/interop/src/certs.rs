//! Certificates no well-behaved CA issues, signed by a lab's CA for the probes: a leaf with
//! two SPIFFE ids, to see which proxy takes it.

use std::path::Path;
use std::time::Duration;

use ambit_identity::{SpiffeId, WorkloadCertificate};
use anyhow::Context;
use rcgen::{
    CertificateParams, DistinguishedName, ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose,
    SanType,
};
use rustls::pki_types::PrivatePkcs8KeyDer;

/// A client and server leaf for `ids[0]` that also names `ids[1]` in a second URI SAN,
/// signed by the plug-in CA in `ca_dir` (`ca-cert.pem`, `ca-key.pem`, `root-cert.pem`).
pub fn two_spiffe_ids(ca_dir: &Path, ids: [&str; 2]) -> anyhow::Result<WorkloadCertificate> {
    let read =
        |f: &str| std::fs::read_to_string(ca_dir.join(f)).with_context(|| format!("reading {f}"));
    let ca_key = KeyPair::from_pem(&read("ca-key.pem")?).context("the CA key")?;
    let ca = CertificateParams::from_ca_cert_pem(&read("ca-cert.pem")?)
        .context("the CA certificate")?
        .self_signed(&ca_key)
        .context("re-creating the CA for signing")?;
    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    params.subject_alt_names = ids
        .iter()
        .map(|id| Ok(SanType::URI((*id).try_into()?)))
        .collect::<Result<_, rcgen::Error>>()?;
    // An end entity as DER has it: a critical basicConstraints of an empty SEQUENCE
    // (rcgen's `ExplicitNoCa` writes the default `cA FALSE`, which DER omits).
    params.is_ca = IsCa::NoCa;
    let mut basic_constraints =
        rcgen::CustomExtension::from_oid_content(&[2, 5, 29, 19], vec![0x30, 0x00]);
    basic_constraints.set_criticality(true);
    params.custom_extensions.push(basic_constraints);
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - Duration::from_secs(60);
    params.not_after = now + Duration::from_secs(3600);
    let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
    let leaf = params.signed_by(&key, &ca, &ca_key)?;
    let certs_of = |f: &str| {
        ambit_identity::pem::parse_certs(read(f)?.as_bytes())
            .map_err(|e| anyhow::anyhow!("{f}: {e}"))
    };
    let roots = certs_of("root-cert.pem")?;
    // The leaf, then the CA's own chain up to (not including) the root.
    let mut chain = vec![leaf.der().clone()];
    chain.extend(
        certs_of("cert-chain.pem")?
            .into_iter()
            .filter(|c| !roots.contains(c)),
    );
    // Built field by field: `WorkloadCertificate::new` refuses a leaf with two SPIFFE ids,
    // which is exactly the certificate this probe needs to present.
    Ok(WorkloadCertificate {
        identity: SpiffeId::parse(ids[0])?,
        chain,
        key: PrivatePkcs8KeyDer::from(key.serialize_der()),
        roots,
        not_before: (now - Duration::from_secs(60)).into(),
        not_after: (now + Duration::from_secs(3600)).into(),
    })
}
