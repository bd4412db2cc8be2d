//! Cost of recognizing a statement: the saver's statements parsed from
//! scratch (a fresh `Classifier` per iteration, so the cache is empty) vs
//! answered from the process-wide cache, and the prefilter that lets
//! ordinary traffic (pgbench) through without a parse.
//!
//! `cargo bench --bench classify`

mod common;

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use resumeguard::saver::classify::{Classifier, StatementKind};
use resumeguard::saver::profile::SaverProfile;

fn fresh() -> Classifier {
    Classifier::new(vec![SaverProfile::langgraph_python()])
}

fn saver_statements(c: &mut Criterion) {
    let read = common::read_latest_sql();
    let cases: [(&str, &str); 5] = [
        ("read_latest", &read),
        ("writes_upsert", common::saver_sql::UPSERT_WRITES),
        ("writes_insert_ignore", common::saver_sql::INSERT_WRITES),
        ("blobs_upsert", common::saver_sql::UPSERT_BLOBS),
        ("checkpoint_upsert", common::saver_sql::UPSERT_CHECKPOINT),
    ];
    // Sanity: these really are recognized (a bench of a misclassification
    // would measure the wrong path).
    let cls = fresh();
    for (name, sql) in cases {
        assert!(
            cls.classify(sql).kind.is_checkpoint_traffic(),
            "{name} not recognized"
        );
    }
    assert!(matches!(cls.classify(&read).kind, StatementKind::Read(_)));

    let mut g = c.benchmark_group("classify_uncached");
    for (name, sql) in cases {
        g.bench_function(name, |b| {
            b.iter_batched(
                fresh,
                |cls| {
                    let r = cls.classify(black_box(sql));
                    (cls, r) // dropped outside the timed section
                },
                BatchSize::SmallInput,
            )
        });
    }
    g.finish();

    let mut g = c.benchmark_group("classify_cached");
    let cls = fresh();
    for (name, sql) in cases {
        cls.classify(sql);
        g.bench_function(name, |b| b.iter(|| cls.classify(black_box(sql))));
    }
    g.finish();
}

fn prefilter(c: &mut Criterion) {
    let cls = fresh();
    let mut g = c.benchmark_group("classify_other");
    for (name, sql) in [
        ("pgbench_select_prepared", common::PGBENCH_SELECT_PREPARED),
        ("pgbench_select_simple", common::PGBENCH_SELECT_SIMPLE),
        ("pgbench_insert_simple", common::PGBENCH_INSERT_SIMPLE),
    ] {
        assert!(!cls.classify(sql).kind.is_checkpoint_traffic());
        g.bench_function(name, |b| b.iter(|| cls.classify(black_box(sql))));
    }
    g.finish();
}

criterion_group!(benches, saver_statements, prefilter);
criterion_main!(benches);
