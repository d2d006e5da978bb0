//! Loading all of MNIST (60000 + 10000 images, IDX gzip) into the in-memory form, against the
//! named baseline: only gunzipping the same four files (flate2, the floor of any loader).
//! Needs BENIGN_DATA_DIR (or ./datasets) to hold mnist/. `cargo bench --bench data_load`.

mod common;
use common::median;

use std::io::Read;
use std::time::Instant;

use benign_attention::data::{self, DatasetName};

fn main() {
    let root = data::data_root(None);
    let dir = root.join("mnist");
    let files = [
        "train-images-idx3-ubyte.gz",
        "train-labels-idx1-ubyte.gz",
        "t10k-images-idx3-ubyte.gz",
        "t10k-labels-idx1-ubyte.gz",
    ];
    let gunzip = || {
        let started = Instant::now();
        for f in files {
            let raw = std::fs::read(dir.join(f)).unwrap_or_else(|e| {
                panic!(
                    "{}: {e} (set BENIGN_DATA_DIR to the data mirror)",
                    dir.join(f).display()
                )
            });
            let mut out = Vec::new();
            flate2::read::GzDecoder::new(&raw[..])
                .read_to_end(&mut out)
                .unwrap();
        }
        started.elapsed().as_secs_f64()
    };
    let load = || {
        let started = Instant::now();
        let mnist = data::load(&DatasetName::Mnist, &root).expect("mnist loads");
        assert_eq!(
            mnist.train.as_ref().unwrap().len() + mnist.test.len(),
            70_000
        );
        started.elapsed().as_secs_f64()
    };
    load();
    let ours = median((0..7).map(|_| load()).collect());
    let floor = median((0..7).map(|_| gunzip()).collect());
    println!("| loading all of MNIST | seconds | vs gunzip only |");
    println!("|---|---|---|");
    println!("| gunzip the 4 files (baseline) | {floor:.3} | 1.00× |");
    println!("| data::load(mnist) | {ours:.3} | {:.2}× |", ours / floor);
}
