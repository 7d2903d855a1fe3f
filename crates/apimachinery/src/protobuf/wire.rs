//! The protobuf wire format as gogo-protobuf writes it for Kubernetes: varints, 64- and 32-bit
//! fixed-width values and length-delimited payloads (no groups). The reader borrows from the
//! input and never reads past its end; every malformation is a [`ProtobufError`].

use super::ProtobufError;

/// Wire type of a varint (int32, int64, uint32, uint64, bool).
pub(crate) const VARINT: u8 = 0;
/// Wire type of a little-endian 64-bit value (double).
pub(crate) const FIXED64: u8 = 1;
/// Wire type of a length-delimited payload (string, bytes, messages, packed repeated).
pub(crate) const LEN: u8 = 2;
/// Wire type of a little-endian 32-bit value (float).
pub(crate) const FIXED32: u8 = 5;

/// The largest field number protobuf allows.
const MAX_FIELD_NUMBER: u64 = (1 << 29) - 1;

/// One field value as it is on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WireValue<'a> {
    Varint(u64),
    Fixed64(u64),
    Len(&'a [u8]),
    Fixed32(u32),
}

impl WireValue<'_> {
    pub(crate) fn wire_type(&self) -> u8 {
        match self {
            WireValue::Varint(_) => VARINT,
            WireValue::Fixed64(_) => FIXED64,
            WireValue::Len(_) => LEN,
            WireValue::Fixed32(_) => FIXED32,
        }
    }
}

/// A cursor over one message's bytes.
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.pos >= self.buf.len()
    }

    /// A base-128 varint of at most 10 bytes; bits beyond 64 are dropped, as Go does.
    pub(crate) fn varint(&mut self) -> Result<u64, ProtobufError> {
        let offset = self.pos;
        let mut value: u64 = 0;
        for i in 0..10 {
            let Some(&b) = self.buf.get(self.pos) else {
                return Err(ProtobufError::TruncatedVarint { offset });
            };
            self.pos += 1;
            value |= u64::from(b & 0x7f) << (7 * i);
            if b < 0x80 {
                return Ok(value);
            }
        }
        Err(ProtobufError::VarintOverflow { offset })
    }

    fn fixed<const N: usize>(&mut self) -> Result<[u8; N], ProtobufError> {
        let offset = self.pos;
        let bytes = self
            .buf
            .get(self.pos..self.pos.saturating_add(N))
            .and_then(|b| <[u8; N]>::try_from(b).ok())
            .ok_or(ProtobufError::TruncatedFixed { offset })?;
        self.pos += N;
        Ok(bytes)
    }

    pub(crate) fn fixed64(&mut self) -> Result<u64, ProtobufError> {
        self.fixed::<8>().map(u64::from_le_bytes)
    }

    pub(crate) fn fixed32(&mut self) -> Result<u32, ProtobufError> {
        self.fixed::<4>().map(u32::from_le_bytes)
    }

    /// A length-delimited payload: a varint length, then that many bytes.
    pub(crate) fn bytes(&mut self) -> Result<&'a [u8], ProtobufError> {
        let offset = self.pos;
        let len = self.varint()?;
        let remaining = self.buf.len() - self.pos;
        match usize::try_from(len) {
            Ok(n) if n <= remaining => {
                let payload = &self.buf[self.pos..self.pos + n];
                self.pos += n;
                Ok(payload)
            }
            _ => Err(ProtobufError::TruncatedLength {
                offset,
                len,
                remaining,
            }),
        }
    }

    /// The next field: its number and its value.
    pub(crate) fn field(&mut self) -> Result<(u32, WireValue<'a>), ProtobufError> {
        let offset = self.pos;
        let key = self.varint()?;
        let number = key >> 3;
        if number == 0 || number > MAX_FIELD_NUMBER {
            return Err(ProtobufError::InvalidFieldNumber { offset, number });
        }
        // The bound above makes the conversion lossless.
        let number = number as u32;
        let value = match (key & 7) as u8 {
            VARINT => WireValue::Varint(self.varint()?),
            FIXED64 => WireValue::Fixed64(self.fixed64()?),
            LEN => WireValue::Len(self.bytes()?),
            FIXED32 => WireValue::Fixed32(self.fixed32()?),
            wire_type => return Err(ProtobufError::InvalidWireType { offset, wire_type }),
        };
        Ok((number, value))
    }
}

/// Appends a base-128 varint.
pub(crate) fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Appends a field key.
pub(crate) fn put_key(out: &mut Vec<u8>, number: u32, wire_type: u8) {
    put_varint(out, (u64::from(number) << 3) | u64::from(wire_type));
}

/// Appends a length-delimited field.
pub(crate) fn put_bytes(out: &mut Vec<u8>, number: u32, payload: &[u8]) {
    put_key(out, number, LEN);
    put_varint(out, payload.len() as u64);
    out.extend_from_slice(payload);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn varint_bytes(v: u64) -> Vec<u8> {
        let mut out = Vec::new();
        put_varint(&mut out, v);
        out
    }

    #[test]
    fn varints_round_trip() {
        for v in [
            0,
            1,
            127,
            128,
            300,
            16_383,
            16_384,
            u64::from(u32::MAX),
            i64::MAX as u64,
            (-1i64) as u64,
            u64::MAX,
        ] {
            let bytes = varint_bytes(v);
            let mut r = Reader::new(&bytes);
            assert_eq!(r.varint(), Ok(v), "{v}");
            assert!(r.is_empty());
        }
        assert_eq!(varint_bytes(300), vec![0xac, 0x02]);
        assert_eq!(varint_bytes((-1i64) as u64).len(), 10);
    }

    #[test]
    fn varint_errors() {
        assert_eq!(
            Reader::new(&[]).varint(),
            Err(ProtobufError::TruncatedVarint { offset: 0 })
        );
        assert_eq!(
            Reader::new(&[0x80, 0x80]).varint(),
            Err(ProtobufError::TruncatedVarint { offset: 0 })
        );
        assert_eq!(
            Reader::new(&[0xff; 11]).varint(),
            Err(ProtobufError::VarintOverflow { offset: 0 })
        );
        // A tenth byte with more than the top bit: the excess is dropped, as in Go.
        let mut ten = vec![0xff; 9];
        ten.push(0x7f);
        assert_eq!(Reader::new(&ten).varint(), Ok(u64::MAX));
    }

    #[test]
    fn fields_of_every_wire_type() {
        let mut buf = Vec::new();
        put_key(&mut buf, 1, VARINT);
        put_varint(&mut buf, 150);
        put_key(&mut buf, 2, FIXED64);
        buf.extend_from_slice(&1.5f64.to_bits().to_le_bytes());
        put_bytes(&mut buf, 3, b"abc");
        put_key(&mut buf, 4, FIXED32);
        buf.extend_from_slice(&7u32.to_le_bytes());
        put_bytes(&mut buf, 536_870_911, b"");
        assert_eq!(&buf[..3], &[0x08, 0x96, 0x01]);

        let mut r = Reader::new(&buf);
        assert_eq!(r.field(), Ok((1, WireValue::Varint(150))));
        assert_eq!(r.field(), Ok((2, WireValue::Fixed64(1.5f64.to_bits()))));
        assert_eq!(r.field(), Ok((3, WireValue::Len(b"abc"))));
        assert_eq!(r.field(), Ok((4, WireValue::Fixed32(7))));
        assert_eq!(r.field(), Ok((536_870_911, WireValue::Len(b""))));
        assert!(r.is_empty());
    }

    #[test]
    fn field_errors() {
        // Field number 0.
        assert_eq!(
            Reader::new(&[0x00, 0x00]).field(),
            Err(ProtobufError::InvalidFieldNumber {
                offset: 0,
                number: 0
            })
        );
        // Groups (3, 4) and the unassigned wire types 6 and 7.
        for wt in [3u8, 4, 6, 7] {
            assert_eq!(
                Reader::new(&[0x08 | wt]).field(),
                Err(ProtobufError::InvalidWireType {
                    offset: 0,
                    wire_type: wt
                })
            );
        }
        // A length past the end, and one that does not fit in usize arithmetic.
        assert_eq!(
            Reader::new(&[0x0a, 0x05, b'a']).field(),
            Err(ProtobufError::TruncatedLength {
                offset: 1,
                len: 5,
                remaining: 1
            })
        );
        let mut huge = vec![0x0a];
        put_varint(&mut huge, u64::MAX);
        assert!(matches!(
            Reader::new(&huge).field(),
            Err(ProtobufError::TruncatedLength { .. })
        ));
        // Truncated fixed-width values.
        assert_eq!(
            Reader::new(&[0x09, 1, 2, 3]).field(),
            Err(ProtobufError::TruncatedFixed { offset: 1 })
        );
        assert_eq!(
            Reader::new(&[0x0d, 1]).field(),
            Err(ProtobufError::TruncatedFixed { offset: 1 })
        );
        // A key cut short.
        assert_eq!(
            Reader::new(&[0x80]).field(),
            Err(ProtobufError::TruncatedVarint { offset: 0 })
        );
    }
}
