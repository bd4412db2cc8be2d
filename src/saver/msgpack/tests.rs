//! msgpack → JSON vectors from the real serializer.

use super::*;
use serde_json::json;

/// Decodes a hex vector produced by the real serializer.
fn dec(hex_blob: &str) -> Value {
    to_json(&hex::decode(hex_blob).unwrap()).unwrap()
}

// Vectors: langgraph-checkpoint 4.3.2 `JsonPlusSerializer().dumps_typed(obj)`,
// run in /work/venv-probe; the Python expression is in each comment.

#[test]
fn plain_values() {
    // ["a", "b"]
    assert_eq!(dec("92a161a162"), json!(["a", "b"]));
    // [None]
    assert_eq!(dec("91c0"), json!([null]));
    // [1]
    assert_eq!(dec("9101"), json!([1]));
    // 7, -300
    assert_eq!(dec("07"), json!(7));
    assert_eq!(dec("d1fed4"), json!(-300));
    // {"k": 1, "n": None, "l": [True, 1.5]}
    assert_eq!(
        dec("83a16b01a16ec0a16c92c3cb3ff8000000000000"),
        json!({"k": 1, "n": null, "l": [true, 1.5]})
    );
    // (1, "a"): tuples are plain arrays
    assert_eq!(dec("9201a161"), json!([1, "a"]));
    // TD(a=1, b=["z"]) with class TD(TypedDict): a TypedDict is a dict
    assert_eq!(dec("82a16101a16291a17a"), json!({"a": 1, "b": ["z"]}));
}

#[test]
fn pydantic_v2_model_is_its_fields() {
    // Person(name="Ann", age=3, tags=["x"], addr=Addr(city="Oslo"))
    let v = dec("c7510594a85f5f6d61696e5f5fa6506572736f6e84a46e616d65a3416e6ea361676503a47461677391a178a46164647282a463697479a44f736c6fa37a6970c0b36d6f64656c5f76616c69646174655f6a736f6e");
    assert_eq!(
        v,
        json!({"name": "Ann", "age": 3, "tags": ["x"], "addr": {"city": "Oslo", "zip": null}})
    );
}

#[test]
fn pydantic_v1_model_is_its_fields() {
    // class Old(pydantic.v1.BaseModel): a: int; Old(a=1)
    assert_eq!(
        dec("c7120493a85f5f6d61696e5f5fa34f6c6481a16101"),
        json!({"a": 1})
    );
}

#[test]
fn dataclass_and_namedtuple_are_their_fields() {
    // @dataclass Point(x=1, y=2.5)
    assert_eq!(
        dec("c71f0293a85f5f6d61696e5f5fa5506f696e7482a17801a179cb4004000000000000"),
        json!({"x": 1, "y": 2.5})
    );
    // namedtuple("NT", "p q")(1, 2)
    assert_eq!(
        dec("c7140293a85f5f6d61696e5f5fa24e5482a17001a17102"),
        json!({"p": 1, "q": 2})
    );
}

#[test]
fn interrupt_list_is_objects_of_fields() {
    // [Interrupt(value="approve?", id="0123456789abcdef0123456789abcdef")]
    let v = dec("91c7610293af6c616e6767726170682e7479706573a9496e7465727275707483a576616c7565a8617070726f76653fa26964d9203031323334353637383961626364656630313233343536373839616263646566af726573706f6e73655f736368656d61c0");
    assert_eq!(
        v,
        json!([{"value": "approve?", "id": "0123456789abcdef0123456789abcdef", "response_schema": null}])
    );
}

#[test]
fn constructor_single_arg_is_the_argument() {
    // uuid.UUID("12345678-1234-5678-1234-567812345678")
    assert_eq!(
        dec("c72d0093a475756964a455554944d9203132333435363738313233343536373831323334353637383132333435363738"),
        json!("12345678-1234-5678-1234-567812345678")
    );
    // {"only"}, frozenset([1]), deque([1, 2])
    assert_eq!(
        dec("c7140093a86275696c74696e73a373657491a46f6e6c79"),
        json!(["only"])
    );
    assert_eq!(
        dec("c7160093a86275696c74696e73a966726f7a656e7365749101"),
        json!([1])
    );
    assert_eq!(
        dec("c7160093ab636f6c6c656374696f6e73a56465717565920102"),
        json!([1, 2])
    );
    // decimal.Decimal("1.25")
    assert_eq!(
        dec("c7160093a7646563696d616ca7446563696d616ca4312e3235"),
        json!("1.25")
    );
    // Color.RED with class Color(Enum): RED = "red"
    assert_eq!(
        dec("c7140093a85f5f6d61696e5f5fa5436f6c6f72a3726564"),
        json!("red")
    );
    // ipaddress.IPv4Address("10.0.0.1"), ZoneInfo("Europe/Oslo"), SecretStr("pw")
    assert_eq!(
        dec("c7200093a9697061646472657373ab4950763441646472657373a831302e302e302e31"),
        json!("10.0.0.1")
    );
    assert_eq!(
        dec("c71f0093a87a6f6e65696e666fa85a6f6e65496e666fab4575726f70652f4f736c6f"),
        json!("Europe/Oslo")
    );
    assert_eq!(
        dec("c71d0093ae707964616e7469632e7479706573a9536563726574537472a27077"),
        json!("pw")
    );
}

#[test]
fn datetime_family() {
    // datetime(2024, 5, 1, 12, 30, tzinfo=timezone.utc): ext 3 fromisoformat
    assert_eq!(
        dec("c73b0394a86461746574696d65a86461746574696d65b9323032342d30352d30315431323a33303a30302b30303a3030ad66726f6d69736f666f726d6174"),
        json!("2024-05-01T12:30:00+00:00")
    );
    // date(2024, 5, 1)
    assert_eq!(
        dec("c7150193a86461746574696d65a46461746593cd07e80501"),
        json!("2024-05-01")
    );
    // time(12, 30, 1, 500)
    assert_eq!(
        dec("c7430293a86461746574696d65a474696d6586a4686f75720ca66d696e7574651ea67365636f6e6401ab6d6963726f7365636f6e64cd01f4a6747a696e666fc0a4666f6c6400"),
        json!("12:30:01.000500")
    );
    // timedelta(days=1, seconds=3661, microseconds=500000)
    assert_eq!(
        dec("c71e0193a86461746574696d65a974696d6564656c74619301cd0e4dce0007a120"),
        json!("P1DT1H1M1.5S")
    );
    // timezone(timedelta(hours=2))
    assert_eq!(
        dec("c7310193a86461746574696d65a874696d657a6f6e6591c71a0193a86461746574696d65a974696d6564656c74619300cd1c2000"),
        json!("+02:00")
    );
}

#[test]
fn iso_durations() {
    assert_eq!(iso_duration(0, 0, 0), "PT0S");
    assert_eq!(iso_duration(2, 0, 0), "P2D");
    assert_eq!(iso_duration(0, 60, 0), "PT1M");
    assert_eq!(iso_duration(-1, 86_399, 0), "-PT1S");
}

#[test]
fn positional_known_classes() {
    // pathlib.Path("/usr/bin")
    assert_eq!(
        dec("c71e0193a7706174686c6962a9506f7369785061746893a12fa3757372a362696e"),
        json!("/usr/bin")
    );
    // re.compile("a+b")
    assert_eq!(
        dec("c7120193a27265a7636f6d70696c6592a3612b6220"),
        json!("a+b")
    );
    // Send("node", {"x": 1})
    assert_eq!(
        dec("c7200193af6c616e6767726170682e7479706573a453656e6492a46e6f646581a17801"),
        json!({"node": "node", "arg": {"x": 1}})
    );
}

#[test]
fn unknown_positional_class_is_its_args() {
    // Ext 1 of ["m", "C", [1, 2]]
    let payload = hex::decode("93a16da143920102").unwrap();
    let mut blob = vec![0xc7, payload.len() as u8, 0x01];
    blob.extend(payload);
    assert_eq!(to_json(&blob).unwrap(), json!([1, 2]));
}

#[test]
fn delta_snapshot_is_its_value() {
    // _DeltaSnapshot(["a"])
    assert_eq!(dec("c7030791a161"), json!(["a"]));
}

#[test]
fn nested_ext_values() {
    // {"when": [date(2020, 1, 2)], "id": UUID(int=1)}
    assert_eq!(
        dec("82a47768656e91c7150193a86461746574696d65a46461746593cd07e40102a26964c72d0093a475756964a455554944d9203030303030303030303030303030303030303030303030303030303030303031"),
        json!({"when": ["2020-01-02"], "id": "00000000-0000-0000-0000-000000000001"})
    );
}

#[test]
fn bytes_nan_and_keys() {
    // {"b": b"hi"}
    assert_eq!(dec("81a162c4026869"), json!({"b": "hi"}));
    // non-UTF-8 bytes inside a value become base64
    assert_eq!(dec("c403fffe00"), json!("//4A"));
    // [nan, inf, -inf]
    assert_eq!(
        dec("93cb7ff8000000000000cb7ff0000000000000cbfff0000000000000"),
        json!(["NaN", "Infinity", "-Infinity"])
    );
    // {1: "a", None: "c", 2.5: "d", (1, 2): "e"}
    assert_eq!(
        dec("8401a161c0a163cb4004000000000000a164920102a165"),
        json!({"1": "a", "null": "c", "2.5": "d", "[1,2]": "e"})
    );
}

#[test]
fn numpy_arrays() {
    // (dtype "<i4", shape (2, 3), "C", 1..=6)
    assert_eq!(
        dec("c7240694a33c6934920203a143c418010000000200000003000000040000000500000006000000"),
        json!([[1, 2, 3], [4, 5, 6]])
    );
    // (dtype "<f8", shape (2, 2), "F", [1.0, 2.0, 3.0, 4.0]) — column-major
    assert_eq!(
        dec("c72c0694a33c6638920202a146c420000000000000f03f000000000000004000000000000008400000000000001040"),
        json!([[1.0, 3.0], [2.0, 4.0]])
    );
    // (dtype "|b1", shape (2,), "C", [1, 0])
    assert_eq!(
        dec("c70d0694a37c62319102a143c4020100"),
        json!([true, false])
    );
}

#[test]
fn numpy_rejects_unknown_dtype_and_bad_size() {
    // dtype "<U1"
    let meta = hex::decode("94a33c55319101a143c40441000000").unwrap();
    let mut blob = vec![0xc7, meta.len() as u8, 0x06];
    blob.extend(meta);
    assert!(matches!(to_json(&blob), Err(MsgpackError::Numpy(_))));
    // "<i4" shape (2,) but 4 bytes
    let meta = hex::decode("94a33c69349102a143c40401000000").unwrap();
    let mut blob = vec![0xc7, meta.len() as u8, 0x06];
    blob.extend(meta);
    assert!(matches!(to_json(&blob), Err(MsgpackError::Numpy(_))));
    // "<i4" shape (2**40, 0), no bytes
    let meta = hex::decode("94a33c693492cf000001000000000000a143c400").unwrap();
    let mut blob = vec![0xc7, meta.len() as u8, 0x06];
    blob.extend(meta);
    assert!(matches!(to_json(&blob), Err(MsgpackError::Numpy(_))));
    // "<i4" shape (3, 0) is fine: three empty rows
    let meta = hex::decode("94a33c6934920300a143c400").unwrap();
    let mut blob = vec![0xc7, meta.len() as u8, 0x06];
    blob.extend(meta);
    assert_eq!(to_json(&blob).unwrap(), json!([[], [], []]));
}

#[test]
fn undecodable_blobs_are_errors() {
    assert!(matches!(to_json(&[]), Err(MsgpackError::Malformed(_))));
    // array of 2 with one element
    assert!(matches!(
        to_json(&[0x92, 0x01]),
        Err(MsgpackError::Malformed(_))
    ));
    assert_eq!(to_json(&[0x01, 0x02]), Err(MsgpackError::Trailing(1)));
    // msgpack timestamp (ext -1)
    assert_eq!(
        to_json(&[0xd6, 0xff, 0, 0, 0, 1]),
        Err(MsgpackError::UnknownExt(-1))
    );
    // ext 42
    assert_eq!(to_json(&[0xd4, 42, 0]), Err(MsgpackError::UnknownExt(42)));
    // ext 2 whose payload is a bare int
    assert!(matches!(
        to_json(&[0xd4, 2, 0x01]),
        Err(MsgpackError::BadExt { code: 2, .. })
    ));
    // ext 5 whose fields are not a map: [m, n, 1, x]
    assert!(matches!(
        to_json(&hex::decode("c7080594a16da16e01a178").unwrap()),
        Err(MsgpackError::BadExt { code: 5, .. })
    ));
    // invalid UTF-8 in a str
    assert_eq!(to_json(&[0xa1, 0xff]), Err(MsgpackError::Utf8));
    // a pickle payload is not msgpack
    assert!(to_json(b"\x80\x04\x95").is_err());
}

#[test]
fn deep_nesting_is_bounded() {
    let mut blob = vec![0x91; 100_000];
    blob.push(0xc0);
    assert_eq!(to_json(&blob), Err(MsgpackError::TooDeep));
}

#[test]
fn base64_padding() {
    assert_eq!(base64(b""), "");
    assert_eq!(base64(b"f"), "Zg==");
    assert_eq!(base64(b"fo"), "Zm8=");
    assert_eq!(base64(b"foo"), "Zm9v");
    assert_eq!(base64(b"foob"), "Zm9vYg==");
}
