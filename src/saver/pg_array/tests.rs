//! Array decoding and encoding in both wire formats: `bytea[]` and `text[]`.

use super::*;

/// Builds a binary `bytea[]` with lower bounds 1.
fn binary(oid: u32, dims: &[i32], elements: &[Option<&[u8]>]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&(dims.len() as i32).to_be_bytes());
    let has_null = elements.iter().any(Option::is_none) as i32;
    out.extend_from_slice(&has_null.to_be_bytes());
    out.extend_from_slice(&oid.to_be_bytes());
    for d in dims {
        out.extend_from_slice(&d.to_be_bytes());
        out.extend_from_slice(&1i32.to_be_bytes());
    }
    for e in elements {
        match e {
            None => out.extend_from_slice(&(-1i32).to_be_bytes()),
            Some(b) => {
                out.extend_from_slice(&(b.len() as i32).to_be_bytes());
                out.extend_from_slice(b);
            }
        }
    }
    out
}

fn hexbytes(s: &str) -> Vec<u8> {
    hex::decode(s.replace([' ', '|'], "")).unwrap()
}

fn b(s: &'static [u8]) -> Option<Bytes> {
    Some(Bytes::from_static(s))
}

/// The `channel_values` example from langgraph-wire.md section 4.
fn channel_values_example() -> Vec<u8> {
    let mut v =
        hexbytes("00000002 00000000 00000011 00000001 00000001 00000003 00000001 | 00000005");
    v.extend_from_slice(b"items");
    v.extend_from_slice(&hexbytes("00000007"));
    v.extend_from_slice(b"msgpack");
    v.extend_from_slice(&hexbytes("00000006 91a470726570"));
    v
}

#[test]
fn decodes_the_documented_channel_values_bytes() {
    let a = ByteaArray::decode_binary(&channel_values_example()).unwrap();
    assert_eq!(a.dims, vec![1, 3]);
    assert_eq!(
        a.elements,
        vec![b(b"items"), b(b"msgpack"), b(b"\x91\xa4prep")]
    );
    let rows: Vec<_> = a.rows().collect();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0][0], b(b"items"));
}

#[test]
fn binary_two_rows_of_six_with_null_blob() {
    let raw = binary(
        17,
        &[2, 6],
        &[
            Some(b"00000000-0000-0000-0000-000000000000"),
            Some(b"__resume__"),
            Some(b"msgpack"),
            Some(b"\xc3"),
            Some(b""),
            Some(b"-4"),
            Some(b"task-1"),
            Some(b"out"),
            Some(b"empty"),
            None,
            Some(b"~__pregel_pull, gate"),
            Some(b"1"),
        ],
    );
    let a = ByteaArray::decode_binary(&raw).unwrap();
    assert_eq!(a.dims, vec![2, 6]);
    let rows: Vec<_> = a.rows().collect();
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0][5], b(b"-4"));
    assert_eq!(rows[0][4], b(b""));
    assert_eq!(rows[1][3], None);
    assert_eq!(rows[1][4], b(b"~__pregel_pull, gate"));
}

#[test]
fn binary_empty_and_one_dimensional() {
    let a = ByteaArray::decode_binary(&binary(17, &[], &[])).unwrap();
    assert_eq!(a, ByteaArray::default());
    assert_eq!(a.rows().count(), 0);

    let a = ByteaArray::decode_binary(&binary(17, &[2], &[Some(b"a"), None])).unwrap();
    assert_eq!(a.dims, vec![2]);
    assert_eq!(a.rows().collect::<Vec<_>>(), vec![&[b(b"a"), None][..]]);

    // A zero-sized dimension is the empty array, as in PostgreSQL.
    let a = ByteaArray::decode_binary(&binary(17, &[0, 3], &[])).unwrap();
    assert_eq!(a, ByteaArray::default());
}

#[test]
fn binary_rejects_wrong_element_oid() {
    let raw = binary(25, &[1], &[Some(b"x")]);
    assert!(matches!(
        ByteaArray::decode_binary(&raw),
        Err(DecodeError::ElementOid(25))
    ));
}

#[test]
fn binary_rejects_bad_header_values() {
    let mut raw = binary(17, &[1], &[Some(b"x")]);
    raw[3] = 7; // ndim 7
    assert!(matches!(
        ByteaArray::decode_binary(&raw),
        Err(DecodeError::ArrayHeader(_))
    ));
    raw[0..4].copy_from_slice(&(-1i32).to_be_bytes());
    assert!(matches!(
        ByteaArray::decode_binary(&raw),
        Err(DecodeError::ArrayHeader(_))
    ));

    let mut raw = binary(17, &[1], &[Some(b"x")]);
    raw[7] = 2; // flags 2
    assert!(matches!(
        ByteaArray::decode_binary(&raw),
        Err(DecodeError::ArrayHeader(_))
    ));

    let raw = binary(17, &[-1], &[]);
    assert!(matches!(
        ByteaArray::decode_binary(&raw),
        Err(DecodeError::ArrayHeader(_))
    ));
}

#[test]
fn binary_rejects_dims_that_disagree_with_elements() {
    // Declares 1x3, carries 4 elements.
    let raw = binary(
        17,
        &[1, 3],
        &[Some(b"a"), Some(b"b"), Some(b"c"), Some(b"d")],
    );
    assert!(matches!(
        ByteaArray::decode_binary(&raw),
        Err(DecodeError::Read(ReadError::TrailingBytes { extra: 5, .. }))
    ));
    // Declares 2x3, carries 3 (enough bytes to pass the count cap).
    let raw = binary(17, &[2, 3], &[Some(b"aaaa"), Some(b"bbbb"), Some(b"cccc")]);
    assert!(matches!(
        ByteaArray::decode_binary(&raw),
        Err(DecodeError::Read(ReadError::Truncated { .. }))
    ));
}

#[test]
fn binary_rejects_huge_declared_counts_before_allocating() {
    let raw = binary(17, &[i32::MAX, i32::MAX], &[Some(b"x")]);
    assert!(matches!(
        ByteaArray::decode_binary(&raw),
        Err(DecodeError::ArrayCount { declared, remaining: 5 })
            if declared == (i32::MAX as u64) * (i32::MAX as u64)
    ));
    let raw = binary(17, &[i32::MAX; 3], &[]);
    assert!(matches!(
        ByteaArray::decode_binary(&raw),
        Err(DecodeError::ArrayHeader(_))
    ));
    let raw = binary(17, &[1_000_000], &[]);
    assert!(matches!(
        ByteaArray::decode_binary(&raw),
        Err(DecodeError::ArrayCount { .. })
    ));
}

#[test]
fn binary_rejects_bad_element_lengths() {
    let mut raw = binary(17, &[1], &[Some(b"x")]);
    let at = raw.len() - 5;
    raw[at..at + 4].copy_from_slice(&(-2i32).to_be_bytes());
    assert!(matches!(
        ByteaArray::decode_binary(&raw),
        Err(DecodeError::Read(ReadError::NegativeLength { len: -2, .. }))
    ));
    raw[at..at + 4].copy_from_slice(&i32::MAX.to_be_bytes());
    assert!(matches!(
        ByteaArray::decode_binary(&raw),
        Err(DecodeError::Read(ReadError::Truncated { remaining: 1, .. }))
    ));
}

#[test]
fn binary_every_truncation_errors_without_panic() {
    let full = channel_values_example();
    for n in 0..full.len() {
        assert!(ByteaArray::decode_binary(&full[..n]).is_err(), "prefix {n}");
    }
    // Single-byte corruption anywhere must not panic either.
    for i in 0..full.len() {
        for v in [0x00, 0x7f, 0x80, 0xff] {
            let mut c = full.clone();
            c[i] = v;
            let _ = ByteaArray::decode_binary(&c);
        }
    }
}

#[test]
fn text_two_dimensional_with_null() {
    let a = ByteaArray::decode_text(
        r#"{{"\\x6974656d73","\\x6d73677061636b",NULL},{"\\x6d","\\x6e756c6c","\\x"}}"#,
    )
    .unwrap();
    assert_eq!(a.dims, vec![2, 3]);
    assert_eq!(
        a.elements,
        vec![
            b(b"items"),
            b(b"msgpack"),
            None,
            b(b"m"),
            b(b"null"),
            b(b"")
        ]
    );
    assert_eq!(a.rows().count(), 2);
}

#[test]
fn text_matches_binary_for_the_documented_example() {
    let text =
        ByteaArray::decode_text(r#"{{"\\x6974656d73","\\x6d73677061636b","\\x91a470726570"}}"#)
            .unwrap();
    let bin = ByteaArray::decode_binary(&channel_values_example()).unwrap();
    assert_eq!(text, bin);
}

#[test]
fn text_unquoted_quoted_null_and_whitespace() {
    let a = ByteaArray::decode_text(r#" { \\x6869 , "NULL" ,null, plain } "#).unwrap();
    assert_eq!(a.dims, vec![4]);
    assert_eq!(a.elements, vec![b(b"hi"), b(b"NULL"), None, b(b"plain")]);
    // Escape-format bytea inside a quoted element: `\\\\` -> `\\` -> `\`.
    let a = ByteaArray::decode_text(r#"{"a\\\\b\\000"}"#).unwrap();
    assert_eq!(a.elements, vec![b(b"a\\b\0")]);
}

#[test]
fn text_empty_and_decorated() {
    assert_eq!(
        ByteaArray::decode_text("{}").unwrap(),
        ByteaArray::default()
    );
    let a = ByteaArray::decode_text(r#"[0:0][1:2]={{"\\x61",NULL}}"#).unwrap();
    assert_eq!(a.dims, vec![1, 2]);
    assert_eq!(a.elements, vec![b(b"a"), None]);
}

#[test]
fn text_rejects_malformed() {
    for bad in [
        "",
        "{",
        "}",
        "x",
        r#"{"\\x61""#,
        r#"{"\\x61"} x"#,
        r#"{{"\\x61"},{"\\x61","\\x62"}}"#,
        r#"{{"\\x61"},"\\x62"}"#,
        r#"{"\\x61",{"\\x62"}}"#,
        "{{}}",
        "{,}",
        "{a,}",
        "{a b\"}",
        r#"{"\\x6"}"#,
        r#"{"\\xzz"}"#,
        "{{{{{{{a}}}}}}}",
        "[1:1",
        "{a\\",
    ] {
        assert!(ByteaArray::decode_text(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn text_corruption_never_panics() {
    let full = r#"{{"\\x6974656d73",NULL},{abc,"\\x"}}"#;
    for i in 0..full.len() {
        for c in ['{', '}', '"', ',', '\\', ' ', 'N', 'x', '0', '[', '=', 'é'] {
            let mut s = full.to_string();
            s.replace_range(i..i + 1, c.encode_utf8(&mut [0; 4]));
            let _ = ByteaArray::decode_text(&s);
        }
    }
}

#[test]
fn text_every_truncation_errors_without_panic() {
    let full = r#"{{"\\x6974656d73","\\x6d73677061636b",NULL},{"\\x6d",abc,"\\x"}}"#;
    for n in 0..full.len() {
        assert!(ByteaArray::decode_text(&full[..n]).is_err(), "prefix {n}");
    }
    assert!(ByteaArray::decode_text(full).is_ok());
}

#[test]
fn encoders_round_trip() {
    let arr = ByteaArray {
        dims: vec![2, 3],
        elements: vec![
            Some(Bytes::from_static(b"a")),
            Some(Bytes::from_static(b"__resume__")),
            None,
            Some(Bytes::from_static(b"b")),
            Some(Bytes::from_static(b"items")),
            Some(Bytes::from_static(b"\x00\xff")),
        ],
    };
    assert_eq!(
        ByteaArray::decode_binary(&arr.encode_binary()).unwrap(),
        arr
    );
    assert_eq!(ByteaArray::decode_text(&arr.encode_text()).unwrap(), arr);
    let none = ByteaArray::default();
    assert_eq!(none.encode_text(), "{}");
    assert_eq!(
        ByteaArray::decode_binary(&none.encode_binary()).unwrap(),
        none
    );
}

fn texts(v: &[Option<&str>]) -> Vec<Option<String>> {
    v.iter().map(|e| e.map(str::to_owned)).collect()
}

#[test]
fn text_array_in_text_form_as_psycopg_sends_a_list_of_thread_ids() {
    let got = decode_text_array(
        br#"{t1,"thread two","q\"uote","back\\slash",NULL,"NULL"}"#,
        false,
    )
    .unwrap();
    assert_eq!(
        got,
        texts(&[
            Some("t1"),
            Some("thread two"),
            Some("q\"uote"),
            Some("back\\slash"),
            None,
            Some("NULL"),
        ])
    );
    assert_eq!(decode_text_array(b"{}", false).unwrap(), texts(&[]));
    // A hex-looking element is text, not bytea.
    assert_eq!(
        decode_text_array(br#"{"\\x41"}"#, false).unwrap(),
        texts(&[Some("\\x41")])
    );
}

#[test]
fn text_array_in_binary_form_takes_string_element_types_only() {
    let raw = binary(25, &[3], &[Some(b"a"), None, Some("é".as_bytes())]);
    assert_eq!(
        decode_text_array(&raw, true).unwrap(),
        texts(&[Some("a"), None, Some("é")])
    );
    let varchar = binary(1043, &[1], &[Some(b"v")]);
    assert_eq!(
        decode_text_array(&varchar, true).unwrap(),
        texts(&[Some("v")])
    );
    assert!(matches!(
        decode_text_array(&binary(17, &[1], &[Some(b"x")]), true),
        Err(DecodeError::ElementOid(17))
    ));
    // and a bytea[] decoder does not take a text[]
    assert!(matches!(
        ByteaArray::decode_binary(&binary(25, &[1], &[Some(b"x")])),
        Err(DecodeError::ElementOid(25))
    ));
}

#[test]
fn text_array_rejects_invalid_utf8_and_broken_syntax() {
    let raw = binary(25, &[1], &[Some(b"\xff\xfe")]);
    assert!(matches!(
        decode_text_array(&raw, true),
        Err(DecodeError::Utf8 { .. })
    ));
    assert!(decode_text_array(b"{a,b", false).is_err());
    assert!(decode_text_array(b"\xff", false).is_err());
    assert!(decode_text_array(&raw[..raw.len() - 1], true).is_err());
}
