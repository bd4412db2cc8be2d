//! Bind, both ways: read with bounds checks, borrowing names and parameter
//! values from the frame, and written (a rewritten client Bind, or the
//! proxy's own).

use bytes::{BufMut, BytesMut};

use super::read::{read_count, read_cstr, read_nullable, take, ReadError};
use super::write::{write_count, write_cstr, write_message, write_nullable, EncodeError};
use crate::wire::frame::HEADER_LEN;

/// One Bind: names, parameter formats and values, result formats.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bind<'a> {
    pub portal: &'a [u8],
    pub statement: &'a [u8],
    pub param_formats: Vec<i16>,
    /// The values as sent (`None`: NULL).
    pub params: Vec<Option<&'a [u8]>>,
    pub result_formats: Vec<i16>,
}

impl<'a> Bind<'a> {
    /// Reads a whole Bind frame (type byte and length included).
    pub fn read(frame: &'a [u8]) -> Result<Self, ReadError> {
        let mut buf = frame.get(HEADER_LEN..).ok_or(ReadError::Truncated {
            what: "bind header",
            needed: HEADER_LEN,
            remaining: frame.len(),
        })?;
        let portal = read_cstr(&mut buf, "bind portal name")?;
        let statement = read_cstr(&mut buf, "bind statement name")?;
        let param_formats = read_i16_list(&mut buf, "bind parameter formats")?;
        let count = read_count(&mut buf, "bind parameter count")?;
        // Each value needs at least its 4-byte length: never reserve more
        // than the frame could describe.
        let mut params = Vec::with_capacity(count.min(buf.len() / 4));
        for _ in 0..count {
            params.push(read_nullable(&mut buf, "bind parameter")?);
        }
        let result_formats = read_i16_list(&mut buf, "bind result formats")?;
        Ok(Bind {
            portal,
            statement,
            param_formats,
            params,
            result_formats,
        })
    }

    /// Appends the Bind frame (type byte and length included).
    pub fn write(&self, out: &mut BytesMut) -> Result<(), EncodeError> {
        write_message(out, b'B', |out| {
            write_cstr(out, self.portal, "the portal name")?;
            write_cstr(out, self.statement, "the statement name")?;
            write_i16_list(out, &self.param_formats, "the parameter formats")?;
            write_count(out, self.params.len(), "the parameters")?;
            for p in &self.params {
                write_nullable(out, *p, "a parameter")?;
            }
            write_i16_list(out, &self.result_formats, "the result formats")
        })
    }
}

fn read_i16_list(buf: &mut &[u8], what: &'static str) -> Result<Vec<i16>, ReadError> {
    let n = read_count(buf, what)?;
    let raw = take(buf, n * 2, what)?;
    Ok(raw
        .chunks_exact(2)
        .map(|c| i16::from_be_bytes([c[0], c[1]]))
        .collect())
}

fn write_i16_list(out: &mut BytesMut, list: &[i16], what: &'static str) -> Result<(), EncodeError> {
    write_count(out, list.len(), what)?;
    for f in list {
        out.put_i16(*f);
    }
    Ok(())
}
