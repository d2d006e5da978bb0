//! The replicas of the authors' random streams (`src/rng/{numpy,torch}.rs`) against
//! `tests/fixtures/authors_rng.json`, which `scripts/authors_rng_fixtures.py` writes from real
//! numpy 2.2.3 and torch 2.6.0.

use benign_attention::rng::numpy::{Pcg64, SeedSequence, choice};
use benign_attention::rng::torch::{Mt19937, label_noise, randperm};
use serde_json::Value;
use sha2::{Digest, Sha256};

fn fixture() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/authors_rng.json"
    );
    let text = std::fs::read_to_string(path).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn u64_of(v: &Value) -> u64 {
    v.as_u64().unwrap()
}

fn usize_vec(v: &Value) -> Vec<usize> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as usize)
        .collect()
}

fn hex_u64(v: &Value) -> u64 {
    let s = v.as_str().unwrap();
    u64::from_str_radix(s.trim_start_matches("0x"), 16).unwrap()
}

/// sha256 of the comma-joined decimal values, as the Python script computes it.
fn digest(values: &[usize]) -> String {
    let joined = values
        .iter()
        .map(|v| v.to_string())
        .collect::<Vec<_>>()
        .join(",");
    Sha256::digest(joined.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Checks a `{len, first20, last20, sha256, full?}` summary against a Rust result.
fn check_summary(case: &Value, got: &[usize], what: &str) {
    assert_eq!(got.len() as u64, u64_of(&case["len"]), "{what}: len");
    let first = usize_vec(&case["first20"]);
    let last = usize_vec(&case["last20"]);
    assert_eq!(got[..first.len()], first[..], "{what}: first20");
    assert_eq!(got[got.len() - last.len()..], last[..], "{what}: last20");
    if let Some(full) = case.get("full") {
        assert_eq!(got, &usize_vec(full)[..], "{what}: full");
    }
    assert_eq!(
        digest(got),
        case["sha256"].as_str().unwrap(),
        "{what}: sha256"
    );
}

#[test]
fn fixture_versions() {
    let f = fixture();
    assert_eq!(f["versions"]["numpy"], "2.2.3");
    assert!(
        f["versions"]["torch"]
            .as_str()
            .unwrap()
            .starts_with("2.6.0")
    );
}

#[test]
fn pcg64_seed_sequence_and_random_raw() {
    let f = fixture();
    let cases = f["pcg64"].as_array().unwrap();
    assert!(!cases.is_empty());
    for case in cases {
        let seed = u64_of(&case["seed"]);
        let ss = SeedSequence::new(seed).unwrap();
        let pool: Vec<u32> = case["pool"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        assert_eq!(ss.pool[..], pool[..], "seed {seed}: pool");
        let state: Vec<u64> = case["state_u64"]
            .as_array()
            .unwrap()
            .iter()
            .map(hex_u64)
            .collect();
        assert_eq!(
            ss.generate_state_u64(4),
            state,
            "seed {seed}: generate_state"
        );
        let raw: Vec<u64> = case["random_raw"]
            .as_array()
            .unwrap()
            .iter()
            .map(hex_u64)
            .collect();
        let mut g = Pcg64::new(seed).unwrap();
        let got: Vec<u64> = (0..raw.len()).map(|_| g.next_u64()).collect();
        assert_eq!(got, raw, "seed {seed}: random_raw");
    }
}

#[test]
fn numpy_choice_all_cases() {
    let f = fixture();
    let cases = f["choice"].as_array().unwrap();
    let (mut tail, mut floyd, mut full) = (0, 0, 0);
    for case in cases {
        let (n_pop, k, seed) = (
            u64_of(&case["N"]) as usize,
            u64_of(&case["k"]) as usize,
            u64_of(&case["seed"]),
        );
        let what = format!("{} choice({n_pop}, {k}) seed {seed}", case["dataset"]);
        // The path label comes from the Python side's copy of numpy's condition.
        match case["path"].as_str().unwrap() {
            "tail_shuffle" => tail += 1,
            "floyd" => floyd += 1,
            other => panic!("unknown path {other}"),
        }
        if case.get("full").is_some() {
            full += 1;
        }
        let got = choice(seed, n_pop, k).unwrap();
        check_summary(case, &got, &what);
    }
    // 17 dataset (N, k) pairs x 5 seeds, plus 10 extra boundary cases.
    assert_eq!(cases.len(), 95);
    assert!(tail >= 45 && floyd >= 40, "tail {tail}, floyd {floyd}");
    assert!(full >= 22, "full arrays: {full}");
}

#[test]
fn torch_label_noise_all_cases() {
    let f = fixture();
    let cases = f["label_noise"].as_array().unwrap();
    assert_eq!(cases.len(), 72);
    for case in cases {
        let s = u64_of(&case["S"]) as usize;
        let c = u64_of(&case["C"]) as u32;
        let eta = case["eta"].as_f64().unwrap();
        let seed = u64_of(&case["seed"]);
        // The script's clean labels: clean[j] = j % C; noisy labels are one digit per row.
        let clean: Vec<u32> = (0..s as u32).map(|j| j % c).collect();
        let expect: Vec<u32> = case["noisy"]
            .as_str()
            .unwrap()
            .chars()
            .map(|ch| ch.to_digit(10).unwrap())
            .collect();
        let got = label_noise(&clean, c, eta, seed).unwrap();
        assert_eq!(got, expect, "S {s} eta {eta} C {c} seed {seed}");
    }
}

#[test]
fn torch_label_noise_paper_case() {
    let f = fixture();
    let expect: Vec<u32> = f["paper_noise_s200_eta01_c10_seed42_zero_clean"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect();
    assert_eq!(label_noise(&[0; 200], 10, 0.1, 42).unwrap(), expect);
}

#[test]
fn torch_randperm_all_cases() {
    let f = fixture();
    let cases = f["randperm"].as_array().unwrap();
    assert_eq!(cases.len(), 20);
    for case in cases {
        let n = u64_of(&case["n"]) as usize;
        let seed = u64_of(&case["seed"]);
        check_summary(
            case,
            &randperm(n, seed),
            &format!("randperm({n}) seed {seed}"),
        );
    }
}

#[test]
fn torch_mt19937_and_rand() {
    let f = fixture();
    for case in f["mt19937"].as_array().unwrap() {
        let seed = u64_of(&case["seed"]);
        // randint(0, 2^32 - 1) = u32 % (2^32 - 1).
        let mut g = Mt19937::new(seed);
        for (i, v) in case["u32_mod_2p32m1"]
            .as_array()
            .unwrap()
            .iter()
            .enumerate()
        {
            let u = u64::from(g.next_u32()) % (u64::from(u32::MAX));
            assert_eq!(u, u64_of(v), "seed {seed}: u32 #{i}");
        }
        let mut g = Mt19937::new(seed);
        for v in case["rand_f32_bits"].as_array().unwrap() {
            assert_eq!(
                f64::from(g.rand_f32()).to_bits(),
                hex_u64(v),
                "seed {seed}: rand f32"
            );
        }
        let mut g = Mt19937::new(seed);
        for v in case["rand_f64_bits"].as_array().unwrap() {
            assert_eq!(g.rand_f64().to_bits(), hex_u64(v), "seed {seed}: rand f64");
        }
    }
}
