//! A reader of the protobuf wire format that walks the fields of one encoded message
//! without decoding or allocating anything: what [`crate::shape`] uses to count repeated
//! fields and measure strings before `prost` turns them into memory, and what any
//! resource type's own shape check can use ([`crate::ResourceType::measure`]).
//!
//! Groups (wire types 3 and 4, deprecated since proto2) are refused: no message ambit
//! reads has one, and refusing them keeps the walk flat.

use std::fmt;

/// One field's value as it sits on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Value<'a> {
    Varint(u64),
    Fixed64,
    /// Length-delimited: a string, bytes, a sub-message or a packed repeated scalar.
    Len(&'a [u8]),
    Fixed32,
}

/// Why the bytes are not a protobuf message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WireError {
    /// A varint (tag, length or value) runs past the end or over 10 bytes.
    BadVarint,
    /// A length-delimited field or fixed value runs past the end.
    Truncated,
    /// Field number 0 or above 2^29-1.
    BadFieldNumber,
    /// Wire type 3 or 4 (groups), 6 or 7.
    BadWireType(u8),
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WireError::BadVarint => f.write_str("invalid varint"),
            WireError::Truncated => f.write_str("a field runs past the end of its message"),
            WireError::BadFieldNumber => f.write_str("invalid field number"),
            WireError::BadWireType(3 | 4) => f.write_str("groups are not accepted"),
            WireError::BadWireType(t) => write!(f, "invalid wire type {t}"),
        }
    }
}

/// The fields of one message, in wire order. Stops after the first error.
pub struct Fields<'a> {
    buf: &'a [u8],
    failed: bool,
}

/// Walks the fields of the message encoded in `buf`: `(field number, value)` each.
pub fn fields(buf: &[u8]) -> Fields<'_> {
    Fields { buf, failed: false }
}

fn varint(buf: &mut &[u8]) -> Result<u64, WireError> {
    let mut v: u64 = 0;
    for i in 0..10 {
        let (&b, rest) = buf.split_first().ok_or(WireError::BadVarint)?;
        *buf = rest;
        v |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return Ok(v);
        }
    }
    Err(WireError::BadVarint)
}

fn take<'a>(buf: &mut &'a [u8], n: u64) -> Result<&'a [u8], WireError> {
    let n = usize::try_from(n).map_err(|_| WireError::Truncated)?;
    if n > buf.len() {
        return Err(WireError::Truncated);
    }
    let (head, rest) = buf.split_at(n);
    *buf = rest;
    Ok(head)
}

impl<'a> Fields<'a> {
    fn read(&mut self) -> Result<(u32, Value<'a>), WireError> {
        let key = varint(&mut self.buf)?;
        let number = key >> 3;
        if number == 0 || number > (1 << 29) - 1 {
            return Err(WireError::BadFieldNumber);
        }
        let value = match key & 7 {
            0 => Value::Varint(varint(&mut self.buf)?),
            1 => {
                take(&mut self.buf, 8)?;
                Value::Fixed64
            }
            2 => {
                let n = varint(&mut self.buf)?;
                Value::Len(take(&mut self.buf, n)?)
            }
            5 => {
                take(&mut self.buf, 4)?;
                Value::Fixed32
            }
            t => return Err(WireError::BadWireType(t as u8)),
        };
        Ok((number as u32, value))
    }
}

impl<'a> Iterator for Fields<'a> {
    type Item = Result<(u32, Value<'a>), WireError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed || self.buf.is_empty() {
            return None;
        }
        let r = self.read();
        self.failed = r.is_err();
        Some(r)
    }
}

/// How many values a repeated varint field adds: one if unpacked, the varints of the
/// payload if packed (a byte without the continuation bit ends one).
pub fn varint_count(v: Value<'_>) -> usize {
    match v {
        Value::Varint(_) => 1,
        Value::Len(b) => b.iter().filter(|&&x| x & 0x80 == 0).count(),
        Value::Fixed32 | Value::Fixed64 => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn walks_every_wire_type() {
        // 1: varint 300, 2: "hi", 3: fixed64, 4: fixed32.
        let buf = [
            0x08, 0xac, 0x02, 0x12, 2, b'h', b'i', 0x19, 0, 0, 0, 0, 0, 0, 0, 0, 0x25, 0, 0, 0, 0,
        ];
        let got: Vec<_> = fields(&buf).collect::<Result<_, _>>().unwrap();
        assert_eq!(
            got,
            vec![
                (1, Value::Varint(300)),
                (2, Value::Len(b"hi")),
                (3, Value::Fixed64),
                (4, Value::Fixed32)
            ]
        );
    }

    #[test]
    fn refuses_malformed() {
        for (buf, want) in [
            (&[0x12, 5, 1][..], WireError::Truncated),
            (&[0x08, 0x80][..], WireError::BadVarint),
            (&[0x08; 1][..], WireError::BadVarint),
            (&[0x00, 0][..], WireError::BadFieldNumber),
            (&[0x0b][..], WireError::BadWireType(3)),
            (&[0x0e][..], WireError::BadWireType(6)),
            (&[0x19, 0, 0][..], WireError::Truncated),
            (&[0x80; 11][..], WireError::BadVarint),
        ] {
            let last = fields(buf).last().unwrap();
            assert_eq!(last, Err(want), "{buf:?}");
        }
        // The walk ends after an error.
        let mut f = fields(&[0x0b, 0x08, 1]);
        assert!(f.next().unwrap().is_err());
        assert!(f.next().is_none());
    }

    #[test]
    fn counts_packed_and_unpacked() {
        assert_eq!(varint_count(Value::Varint(7)), 1);
        assert_eq!(varint_count(Value::Len(&[1, 0x80, 1, 3])), 3);
        assert_eq!(varint_count(Value::Len(&[])), 0);
    }
}
