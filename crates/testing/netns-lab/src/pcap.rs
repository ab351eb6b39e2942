//! Just enough of the classic pcap format (what `tcpdump -w` writes) to check what crossed
//! a link: TCP ports and payload of every IPv4/IPv6 packet on an Ethernet capture.

use anyhow::{bail, Context};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcpSegment {
    pub src_port: u16,
    pub dst_port: u16,
    pub payload: Vec<u8>,
}

#[derive(Debug, Default)]
pub struct Capture {
    pub tcp: Vec<TcpSegment>,
    /// Frames that were not TCP over IP (ARP, neighbour discovery, ...).
    pub other: usize,
}

impl Capture {
    /// Whether `needle` appears in any TCP payload.
    pub fn payload_contains(&self, needle: &[u8]) -> bool {
        self.tcp
            .iter()
            .any(|s| s.payload.windows(needle.len()).any(|w| w == needle))
    }

    /// The set of (lower) port numbers seen on either side of TCP segments.
    pub fn tcp_ports(&self) -> std::collections::BTreeSet<u16> {
        self.tcp
            .iter()
            .map(|s| s.src_port.min(s.dst_port))
            .collect()
    }
}

fn u16_at(b: &[u8], at: usize, le: bool) -> Option<u16> {
    let s: [u8; 2] = b.get(at..at + 2)?.try_into().ok()?;
    Some(if le {
        u16::from_le_bytes(s)
    } else {
        u16::from_be_bytes(s)
    })
}

fn u32_at(b: &[u8], at: usize, le: bool) -> Option<u32> {
    let s: [u8; 4] = b.get(at..at + 4)?.try_into().ok()?;
    Some(if le {
        u32::from_le_bytes(s)
    } else {
        u32::from_be_bytes(s)
    })
}

pub fn parse(data: &[u8]) -> anyhow::Result<Capture> {
    let le = match data.get(0..4) {
        Some([0xd4, 0xc3, 0xb2, 0xa1]) | Some([0x4d, 0x3c, 0xb2, 0xa1]) => true,
        Some([0xa1, 0xb2, 0xc3, 0xd4]) | Some([0xa1, 0xb2, 0x3c, 0x4d]) => false,
        _ => bail!("not a pcap file (bad magic)"),
    };
    let linktype = u32_at(data, 20, le).context("truncated pcap header")?;
    if linktype != 1 {
        bail!("unsupported link type {linktype}: capture on one Ethernet interface");
    }
    let mut capture = Capture::default();
    let mut at = 24;
    while at < data.len() {
        let incl = u32_at(data, at + 8, le).context("truncated record header")? as usize;
        let frame = data
            .get(at + 16..at + 16 + incl)
            .context("truncated record")?;
        at += 16 + incl;
        match tcp_of_ethernet(frame) {
            Some(seg) => capture.tcp.push(seg),
            None => capture.other += 1,
        }
    }
    Ok(capture)
}

fn tcp_of_ethernet(frame: &[u8]) -> Option<TcpSegment> {
    let ethertype = u16_at(frame, 12, false)?;
    let ip = frame.get(14..)?;
    let (proto, l4, total) = match ethertype {
        0x0800 => {
            let ihl = (ip.first()? & 0x0f) as usize * 4;
            let total = u16_at(ip, 2, false)? as usize;
            (*ip.get(9)?, ihl, total)
        }
        0x86dd => (*ip.get(6)?, 40, 40 + u16_at(ip, 4, false)? as usize),
        _ => return None,
    };
    if proto != 6 {
        return None;
    }
    let ip = ip.get(..total.min(ip.len()))?;
    let tcp = ip.get(l4..)?;
    let data_offset = ((tcp.get(12)? >> 4) as usize) * 4;
    Some(TcpSegment {
        src_port: u16_at(tcp, 0, false)?,
        dst_port: u16_at(tcp, 2, false)?,
        payload: tcp.get(data_offset..)?.to_vec(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame_v4(sport: u16, dport: u16, payload: &[u8]) -> Vec<u8> {
        let mut f = vec![0u8; 12];
        f.extend_from_slice(&[0x08, 0x00]);
        let total = (20 + 20 + payload.len()) as u16;
        let mut ip = vec![
            0x45, 0, 0, 0, 0, 0, 0, 0, 64, 6, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2,
        ];
        ip[2..4].copy_from_slice(&total.to_be_bytes());
        f.extend_from_slice(&ip);
        let mut tcp = vec![0u8; 20];
        tcp[0..2].copy_from_slice(&sport.to_be_bytes());
        tcp[2..4].copy_from_slice(&dport.to_be_bytes());
        tcp[12] = 5 << 4;
        f.extend_from_slice(&tcp);
        f.extend_from_slice(payload);
        f
    }

    fn pcap_of(frames: &[Vec<u8>]) -> Vec<u8> {
        let mut d = vec![0xd4, 0xc3, 0xb2, 0xa1, 2, 0, 4, 0];
        d.extend_from_slice(&[0; 8]);
        d.extend_from_slice(&65535u32.to_le_bytes());
        d.extend_from_slice(&1u32.to_le_bytes());
        for f in frames {
            d.extend_from_slice(&[0; 8]);
            d.extend_from_slice(&(f.len() as u32).to_le_bytes());
            d.extend_from_slice(&(f.len() as u32).to_le_bytes());
            d.extend_from_slice(f);
        }
        d
    }

    #[test]
    fn finds_ports_and_payload() {
        let data = pcap_of(&[frame_v4(40000, 15008, b"\x16\x03\x01secret"), vec![0u8; 60]]);
        let c = parse(&data).unwrap();
        assert_eq!(c.tcp.len(), 1);
        assert_eq!(c.other, 1);
        assert_eq!(c.tcp_ports().into_iter().collect::<Vec<_>>(), vec![15008]);
        assert!(c.payload_contains(b"secret"));
        assert!(!c.payload_contains(b"absent"));
    }

    #[test]
    fn rejects_garbage_without_panicking() {
        assert!(parse(b"nope").is_err());
        let mut data = pcap_of(&[frame_v4(1, 2, b"x")]);
        data.truncate(data.len() - 3);
        assert!(parse(&data).is_err());
    }
}
