//! The migration that lets claims and run leases have keys of any length
//! a checkpoint key can have. A btree index tuple holds at most ~2.7 KB,
//! so a primary key on the full key columns refused ("index row size
//! exceeds btree maximum", and the reader 58000) a thread id the
//! checkpoint tables themselves accept: the claims key adds the interrupt
//! fingerprint to the checkpoint's own. Each table's primary key becomes
//! a digest of its key columns — sha256 of each column prefixed with its
//! length in bytes (the last one needs none), a generated column, so every
//! writer computes it identically and `ON CONFLICT` infers it — and its
//! lookups go through a hash index on the thread id (a hash index stores
//! the value's hash, never the value). The full key columns stay, for the
//! lookups' exact match and for display. Existing rows get their digest
//! when the column is added.

/// `value` as bytes, exactly: text cast to bytea is parsed as bytea's
/// escape format, in which only a backslash (`chr(92)`) is special.
fn bytes(value: &str) -> String {
    format!("replace({value}, chr(92), chr(92) || chr(92))::bytea")
}

/// The digest of `columns`: each but the last prefixed with its length in
/// bytes and a colon.
fn digest(columns: &[&str]) -> String {
    let mut parts = Vec::with_capacity(columns.len());
    for (i, c) in columns.iter().enumerate() {
        if i + 1 == columns.len() {
            parts.push((*c).to_owned());
        } else {
            parts.push(format!("octet_length({c})::text || ':' || {c}"));
        }
    }
    format!("sha256({})", bytes(&parts.join(" || ")))
}

pub(super) fn key_digest_migration(s: &str) -> String {
    let claim_key = digest(&["thread_id", "checkpoint_ns", "checkpoint_id", "fingerprint"]);
    let lease_key = digest(&["thread_id", "checkpoint_ns"]);
    format!(
        r#"
ALTER TABLE {s}.claims ADD COLUMN key_digest bytea GENERATED ALWAYS AS ({claim_key}) STORED;
ALTER TABLE {s}.claims DROP CONSTRAINT claims_pkey,
    ADD CONSTRAINT claims_pkey PRIMARY KEY (key_digest);
CREATE INDEX claims_thread ON {s}.claims USING hash (thread_id);
ALTER TABLE {s}.run_leases ADD COLUMN key_digest bytea GENERATED ALWAYS AS ({lease_key}) STORED;
ALTER TABLE {s}.run_leases DROP CONSTRAINT run_leases_pkey,
    ADD CONSTRAINT run_leases_pkey PRIMARY KEY (key_digest);
CREATE INDEX run_leases_thread ON {s}.run_leases USING hash (thread_id);
"#
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_column_but_the_last_is_length_prefixed() {
        assert_eq!(
            digest(&["a", "b"]),
            "sha256(replace(octet_length(a)::text || ':' || a || b, chr(92), chr(92) || chr(92))::bytea)"
        );
    }
}
