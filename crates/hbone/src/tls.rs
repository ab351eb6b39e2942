//! TLS edges of HBONE: handshakes with the caller's rustls configs plus the checks HBONE adds
//! (ALPN `h2` negotiated; the client presented a certificate). Identity verification itself is
//! the configs' job (their certificate verifiers check SPIFFE ids and trust domains).

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_rustls::{client, server, LazyConfigAcceptor, TlsConnector};

use crate::error::HboneError;

/// The only ALPN protocol HBONE speaks.
pub const ALPN_H2: &[u8] = b"h2";

/// Time allowed for the server side TLS + HTTP/2 handshake of one connection.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The server name a client passes to rustls: HBONE sends no SNI and never checks names, and
/// rustls sends no SNI for an IP address.
pub fn placeholder_server_name() -> ServerName<'static> {
    ServerName::IpAddress(IpAddr::V4(Ipv4Addr::UNSPECIFIED).into())
}

fn check_alpn(alpn: Option<&[u8]>) -> Result<(), HboneError> {
    match alpn {
        Some(ALPN_H2) => Ok(()),
        Some(other) => Err(HboneError::Alpn(
            String::from_utf8_lossy(other).into_owned(),
        )),
        None => Err(HboneError::Alpn("none".into())),
    }
}

/// Encrypted bytes rustls may hold for the socket (its default: 64 KiB). A bulk write is
/// encrypted and handed to the kernel in pieces of up to this size: larger pieces mean a
/// quarter of the `writev` calls and of the peer's wake-ups under bulk transfer (paired
/// runs: +3 % single-stream throughput, -6 % receiving-proxy CPU per GB; BENCHMARKS.md).
/// Only a connection whose socket is full holds that much.
const SEND_BUFFER_LIMIT: usize = 256 * 1024;

/// Client handshake over an established transport (TCP made by the caller with its socket
/// options). The config's verifier must check the server's SPIFFE identity; this function
/// checks that ALPN `h2` was negotiated.
pub async fn connect<IO>(
    io: IO,
    config: Arc<rustls::ClientConfig>,
) -> Result<client::TlsStream<IO>, HboneError>
where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    let tls = TlsConnector::from(config)
        .connect(placeholder_server_name(), io)
        .await
        .map_err(HboneError::tls)?;
    check_alpn(tls.get_ref().1.alpn_protocol())?;
    let mut tls = tls;
    tls.get_mut().1.set_buffer_limit(Some(SEND_BUFFER_LIMIT));
    Ok(tls)
}

/// Server handshake: requires ALPN `h2` and a client certificate.
pub async fn accept<IO>(
    io: IO,
    config: Arc<rustls::ServerConfig>,
) -> Result<server::TlsStream<IO>, HboneError>
where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    let accepted = accept_reporting(io, async { Some(config) }, || {}).await?;
    Ok(accepted.expect("the configuration was given"))
}

/// [`accept`], calling `on_hello` once the client's whole ClientHello has arrived (the
/// first sign that it is a TLS client making progress, which admission ranks above a
/// connection that has sent nothing yet), and only then awaiting `config`; `Ok(None)` when
/// `config` gives none.
pub async fn accept_reporting<IO>(
    io: IO,
    config: impl std::future::Future<Output = Option<Arc<rustls::ServerConfig>>>,
    on_hello: impl FnOnce(),
) -> Result<Option<server::TlsStream<IO>>, HboneError>
where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    let start = LazyConfigAcceptor::new(rustls::server::Acceptor::default(), io)
        .await
        .map_err(HboneError::tls)?;
    on_hello();
    let Some(config) = config.await else {
        return Ok(None);
    };
    let tls = start.into_stream(config).await.map_err(HboneError::tls)?;
    let conn = tls.get_ref().1;
    check_alpn(conn.alpn_protocol())?;
    if conn.peer_certificates().is_none_or(|c| c.is_empty()) {
        return Err(HboneError::NoClientCertificate);
    }
    let mut tls = tls;
    tls.get_mut().1.set_buffer_limit(Some(SEND_BUFFER_LIMIT));
    Ok(Some(tls))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alpn() {
        assert!(check_alpn(Some(b"h2")).is_ok());
        assert!(
            matches!(check_alpn(Some(b"http/1.1")), Err(HboneError::Alpn(p)) if p == "http/1.1")
        );
        assert!(matches!(check_alpn(None), Err(HboneError::Alpn(_))));
        assert!(matches!(
            placeholder_server_name(),
            ServerName::IpAddress(_)
        ));
    }
}
