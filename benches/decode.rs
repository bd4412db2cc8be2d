//! Cost of decoding what the proxy looks inside: a pending-write Bind (read
//! by the codec, and kept), the write record read from it, and a checkpoint row with binary `bytea[]`
//! arrays.
//!
//! `cargo bench --bench decode`

mod common;

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use resumeguard::saver::checkpoint_row::{decode_checkpoint_row, RowLayout};
use resumeguard::saver::classify::StatementKind;
use resumeguard::saver::write_record::WriteRecord;
use resumeguard::wire::messages::data_row::split_data_row;

fn bind(c: &mut Criterion) {
    let frame = common::interrupt_write_bind("_pg3_2");
    let decoded = common::kept_bind(&frame).unwrap();
    assert_eq!(decoded.params.len(), 9);
    let mut g = c.benchmark_group("decode");
    g.throughput(Throughput::Bytes(frame.len() as u64));
    g.bench_function("bind_9_params", |b| {
        b.iter(|| common::kept_bind(black_box(&frame)).unwrap())
    });

    let cls = common::classifier().classify(common::saver_sql::UPSERT_WRITES);
    let StatementKind::WritesUpsert(shape) = &cls.kind else {
        panic!("writes upsert not recognized: {:?}", cls.kind)
    };
    let rec = WriteRecord::decode(shape, &decoded).unwrap();
    assert_eq!(rec.channel.as_deref(), Some("__interrupt__"));
    assert_eq!(rec.idx, Some(-3));
    g.bench_function("write_record", |b| {
        b.iter(|| WriteRecord::decode(black_box(shape), black_box(&decoded)).unwrap())
    });
    g.bench_function("bind_then_write_record", |b| {
        b.iter(|| {
            let bound = common::kept_bind(black_box(&frame)).unwrap();
            WriteRecord::decode(shape, &bound).unwrap()
        })
    });
    g.finish();
}

fn row(c: &mut Criterion) {
    let body = common::checkpoint_row_body();
    let fields = split_data_row(&body).unwrap();
    let row = decode_checkpoint_row(&fields, &[1], &RowLayout::SAVER_SELECT).unwrap();
    assert!(row.has_pending("__interrupt__") && !row.has_pending("__resume__"));
    assert_eq!((row.channel_values.len(), row.pending_writes.len()), (2, 3));

    let mut g = c.benchmark_group("decode");
    g.throughput(Throughput::Bytes(body.len() as u64));
    g.bench_function("split_data_row", |b| {
        b.iter(|| split_data_row(black_box(&body)).unwrap())
    });
    g.bench_function("checkpoint_row", |b| {
        b.iter(|| {
            let fields = split_data_row(black_box(&body)).unwrap();
            decode_checkpoint_row(&fields, &[1], &RowLayout::SAVER_SELECT).unwrap()
        })
    });
    g.finish();
}

criterion_group!(benches, bind, row);
criterion_main!(benches);
