//! The parameters of a checkpoint statement's Bind, kept past the frame
//! and read as values. The codec read the Bind ([`Bind`]); only Binds of
//! recognized checkpoint statements are kept, everything else passes as
//! bytes.

use bytes::{Bytes, BytesMut};

use super::decode_error::utf8;
use super::decode_error::DecodeError;
use super::value::{decode_value, ColumnKind, Value};
use crate::wire::messages::bind::{write_bind, Bind};
use crate::wire::messages::write::EncodeError;

/// Parameters and formats of one Bind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BoundParams {
    pub portal: String,
    pub statement: String,
    pub param_formats: Vec<i16>,
    pub params: Vec<Option<Bytes>>,
    pub result_formats: Vec<i16>,
}

impl BoundParams {
    /// Keeps what `bind` carries; fails when its parameters do not read
    /// or its names are not UTF-8.
    pub fn keep(bind: &Bind<'_>) -> Result<Self, DecodeError> {
        let parameters = bind.parameters()?;
        Ok(BoundParams {
            portal: utf8(bind.portal, "bind portal name")?,
            statement: utf8(bind.statement, "bind statement name")?,
            param_formats: parameters.formats.to_vec(),
            params: parameters
                .values
                .iter()
                .map(|p| p.map(Bytes::copy_from_slice))
                .collect(),
            result_formats: parameters.result_formats.to_vec(),
        })
    }

    /// Encodes a Bind frame (type byte and length included).
    pub fn encode(&self) -> Result<Vec<u8>, EncodeError> {
        let values: usize = self.params.iter().flatten().map(|p| p.len() + 4).sum();
        let mut out = BytesMut::with_capacity(64 + values);
        write_bind(
            &mut out,
            self.portal.as_bytes(),
            self.statement.as_bytes(),
            &self.param_formats,
            self.params.iter().map(Option::as_deref),
            &self.result_formats,
        )?;
        Ok(Vec::from(out))
    }

    /// The format of parameter `i` by the protocol's rules: no codes =
    /// text, one code = all, else one per parameter.
    pub fn format_of(&self, i: usize) -> i16 {
        match self.param_formats.as_slice() {
            [] => 0,
            [one] => *one,
            many => many.get(i).copied().unwrap_or(0),
        }
    }

    /// Parameter `i` decoded as a value of `kind`.
    pub fn value(&self, i: usize, kind: ColumnKind) -> Result<Value, DecodeError> {
        let raw = self
            .params
            .get(i)
            .ok_or(DecodeError::MissingColumn {
                column: "bind parameter",
                index: i,
                count: self.params.len(),
            })?
            .as_deref();
        decode_value(raw, self.format_of(i), kind)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::wire::messages::read::HEADER_LEN;

    /// A whole Bind frame read by the codec and kept.
    pub(crate) fn decode(frame: &[u8]) -> Result<BoundParams, DecodeError> {
        let body = frame.get(HEADER_LEN..).unwrap_or_default();
        BoundParams::keep(&Bind::read_body(body)?)
    }

    /// Builds a Bind frame the way psycopg sends saver writes.
    pub(crate) fn bind_frame(
        stmt: &str,
        formats: &[i16],
        params: &[Option<&[u8]>],
        results: &[i16],
    ) -> Vec<u8> {
        let mut body = Vec::new();
        body.push(0); // unnamed portal
        body.extend_from_slice(stmt.as_bytes());
        body.push(0);
        body.extend_from_slice(&(formats.len() as i16).to_be_bytes());
        for f in formats {
            body.extend_from_slice(&f.to_be_bytes());
        }
        body.extend_from_slice(&(params.len() as i16).to_be_bytes());
        for p in params {
            match p {
                Some(b) => {
                    body.extend_from_slice(&(b.len() as i32).to_be_bytes());
                    body.extend_from_slice(b);
                }
                None => body.extend_from_slice(&(-1i32).to_be_bytes()),
            }
        }
        body.extend_from_slice(&(results.len() as i16).to_be_bytes());
        for r in results {
            body.extend_from_slice(&r.to_be_bytes());
        }
        let mut frame = vec![b'B'];
        frame.extend_from_slice(&((body.len() + 4) as i32).to_be_bytes());
        frame.extend(body);
        frame
    }

    #[test]
    fn decodes_a_pending_write_bind() {
        let frame = bind_frame(
            "_pg3_4",
            &[0, 0, 0, 0, 0, 1, 0, 0, 1],
            &[
                Some(b"t1"),
                Some(b""),
                Some(b"1f0-abc"),
                Some(b"00000000-0000-0000-0000-000000000000"),
                Some(b""),
                Some(&[0xff, 0xfc]),
                Some(b"__resume__"),
                Some(b"msgpack"),
                Some(&[0xc3]),
            ],
            &[1],
        );
        let b = decode(&frame).unwrap();
        assert_eq!((b.portal.as_str(), b.statement.as_str()), ("", "_pg3_4"));
        assert_eq!(b.value(5, ColumnKind::Int).unwrap().as_int(), Some(-4));
        assert_eq!(
            b.value(6, ColumnKind::Text).unwrap().as_str(),
            Some("__resume__")
        );
        assert_eq!(
            b.value(8, ColumnKind::Bytea).unwrap().as_bytes(),
            Some(&[0xc3][..])
        );
        assert_eq!(b.result_formats, vec![1]);
        assert!(b.value(9, ColumnKind::Text).is_err());
    }

    #[test]
    fn encode_round_trips() {
        let frame = bind_frame("s1", &[0, 1], &[Some(b"abc"), None], &[1, 0, 1]);
        let b = decode(&frame).unwrap();
        assert_eq!(b.encode().unwrap(), frame);
    }

    #[test]
    fn formats_follow_the_protocol_rules() {
        let one = decode(&bind_frame("s", &[1], &[Some(b"\x00\x07")], &[])).unwrap();
        assert_eq!(one.format_of(0), 1);
        let none = decode(&bind_frame("s", &[], &[Some(b"7"), None], &[])).unwrap();
        assert_eq!(none.format_of(1), 0);
        assert_eq!(none.value(0, ColumnKind::Int).unwrap().as_int(), Some(7));
        assert_eq!(none.value(1, ColumnKind::Text).unwrap(), Value::Null);
    }

    #[test]
    fn truncated_binds_are_errors_not_panics() {
        let frame = bind_frame("s", &[0, 1], &[Some(b"abc"), Some(b"\x01\x02")], &[1]);
        for cut in 0..frame.len() {
            assert!(decode(&frame[..cut]).is_err(), "cut at {cut}");
        }
    }
}
