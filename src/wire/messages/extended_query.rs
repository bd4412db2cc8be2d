//! The extended-query messages the proxy writes besides Bind: Parse,
//! Execute and Close (the client's own are forwarded as they came).

use bytes::{BufMut, BytesMut};

use super::frontend::Target;
use super::write::{write_cstr, write_message, EncodeError};

/// No parameter types: the count 0, as a Parse's type section.
pub const NO_PARAM_TYPES: &[u8] = &[0, 0];

/// A Flush: the server sends what it has answered so far.
pub const FLUSH: &[u8] = b"H\0\0\0\x04";

/// A Sync: the end of a pipeline segment.
pub const SYNC: &[u8] = b"S\0\0\0\x04";

/// Appends a Parse of `sql` as statement `name`; `param_types` is the
/// parameter-type section as a client sent it (count, then the oids).
pub fn write_parse(
    out: &mut BytesMut,
    name: &[u8],
    sql: &[u8],
    param_types: &[u8],
) -> Result<(), EncodeError> {
    write_message(out, b'P', |out| {
        write_cstr(out, name, "the statement name")?;
        write_cstr(out, sql, "the statement")?;
        out.put_slice(param_types);
        Ok(())
    })
}

/// A Parse frame for `name` with new SQL and the original parameter types.
pub fn parse_frame(name: &[u8], sql: &[u8], param_types: &[u8]) -> Result<Vec<u8>, EncodeError> {
    let mut out = BytesMut::with_capacity(16 + name.len() + sql.len() + param_types.len());
    write_parse(&mut out, name, sql, param_types)?;
    Ok(Vec::from(out))
}

/// Appends an Execute of `portal`, `max_rows` 0 meaning all.
pub fn write_execute(out: &mut BytesMut, portal: &[u8], max_rows: i32) -> Result<(), EncodeError> {
    write_message(out, b'E', |out| {
        write_cstr(out, portal, "the portal name")?;
        out.put_i32(max_rows);
        Ok(())
    })
}

/// Appends a Close of the statement or portal `name`.
pub fn write_close(out: &mut BytesMut, target: Target, name: &[u8]) -> Result<(), EncodeError> {
    write_message(out, b'C', |out| {
        out.put_u8(match target {
            Target::Statement => b'S',
            Target::Portal => b'P',
        });
        write_cstr(out, name, "the closed name")
    })
}
