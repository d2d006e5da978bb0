//! Your own data under hostile input (issue 75): decompression bombs, npz arrays whose header
//! lies, huge and empty texts, error lines quoting huge values, settings out of range, and the
//! smaller traps of CSV, JSONL, Parquet and folders. Files are made by the tools the docs name
//! (Pillow, numpy, pandas/pyarrow, Python's csv) from the fixture venv `.ci/run` makes
//! (`BENIGN_FIXTURE_PYTHON`, else `target/fixture-venv/bin/python`); without it the tests that
//! need one skip, saying so. Each refusal is exit 2, one `error:` line naming the file or the key,
//! and nothing left on disk; the bombs also run under `prlimit --as` of 2 GiB, and their peak
//! memory is measured.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;

/// The Python with Pillow, numpy, pandas and pyarrow, or a visible skip.
fn python(test: &str) -> Option<PathBuf> {
    let candidate = std::env::var_os("BENIGN_FIXTURE_PYTHON")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("target/fixture-venv/bin/python")
        });
    let works = Command::new(&candidate)
        .args(["-c", "import PIL, numpy, pandas, pyarrow"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if works {
        Some(candidate)
    } else {
        common::skip(
            test,
            &format!(
                "no Python with Pillow, numpy, pandas and pyarrow at {} (set BENIGN_FIXTURE_PYTHON; .ci/run makes the venv)",
                candidate.display()
            ),
        )
    }
}

/// Runs `script` with `python`, `DIR` in it replaced by `dir`.
fn make(python: &Path, dir: &Path, script: &str) {
    let script = script.replace("DIR", dir.to_str().unwrap());
    let out = Command::new(python).args(["-c", &script]).output().unwrap();
    assert!(
        out.status.success(),
        "fixture script failed:\n{script}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// How a command ended: exit status, stderr and peak resident memory.
struct Ended {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    peak_bytes: u64,
}

/// The binary with `args` (under `prlimit --as=BYTES` when `address_space` is given), its cache
/// in `cache`, killed after 120 s; its peak RSS from `wait4`.
fn run(args: &[&str], cache: &Path, address_space: Option<u64>) -> Ended {
    let (out_log, err_log) = (
        tempfile::NamedTempFile::new().unwrap(),
        tempfile::NamedTempFile::new().unwrap(),
    );
    let bin = env!("CARGO_BIN_EXE_benign-attention");
    let mut command = match address_space {
        // prlimit execs the command: the pid waited for is the program's own.
        Some(bytes) => {
            let mut c = Command::new("prlimit");
            c.arg(format!("--as={bytes}")).arg(bin);
            c
        }
        None => Command::new(bin),
    };
    command
        .args(args)
        .env("BENIGN_CACHE_DIR", cache)
        .stdin(Stdio::null())
        .stdout(out_log.reopen().unwrap())
        .stderr(err_log.reopen().unwrap());
    #[allow(clippy::zombie_processes)]
    let child = command.spawn().unwrap();
    let pid = child.id() as libc::pid_t;
    let started = Instant::now();
    let (mut status, mut usage): (libc::c_int, libc::rusage) = (0, unsafe { std::mem::zeroed() });
    loop {
        // SAFETY: waits for our own child, writing into the two locals.
        let done = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut usage) };
        if done == pid {
            break;
        }
        if started.elapsed() > Duration::from_secs(120) {
            // SAFETY: our own child.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
            panic!("{args:?}: still running after 120 s, killed");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ended {
        code: libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status)),
        stdout: std::fs::read_to_string(out_log.path()).unwrap(),
        stderr: std::fs::read_to_string(err_log.path()).unwrap(),
        peak_bytes: usage.ru_maxrss as u64 * 1024,
    }
}

/// Exit 2 and one `error:` line (warnings aside) holding every needle, at most 1000 bytes.
fn assert_refused(case: &str, ended: &Ended, needles: &[&str]) {
    let lines: Vec<&str> = ended
        .stderr
        .lines()
        .filter(|l| !l.starts_with("warning:") && !l.starts_with("note:"))
        .collect();
    assert_eq!(ended.code, Some(2), "{case}: {}", excerpt(&ended.stderr));
    assert_eq!(
        lines.len(),
        1,
        "{case}: not one line:\n{}",
        excerpt(&ended.stderr)
    );
    assert!(
        lines[0].starts_with("error: "),
        "{case}: {}",
        excerpt(lines[0])
    );
    assert!(
        lines[0].len() <= 1000,
        "{case}: a line of {} bytes",
        lines[0].len()
    );
    for needle in needles {
        assert!(
            lines[0].contains(needle),
            "{case}: no {needle:?} in {}",
            excerpt(lines[0])
        );
    }
}

/// `finetune --dataset source --eta 0.2` refused as [`assert_refused`] says, leaving no run folder.
fn assert_finetune_refused(source: &str, dir: &Path, cache: &Path, needles: &[&str]) {
    let out = dir.join("out");
    let ended = run(
        &[
            "finetune",
            "--dataset",
            source,
            "--eta",
            "0.2",
            "--out",
            out.to_str().unwrap(),
        ],
        cache,
        None,
    );
    assert_refused(source, &ended, needles);
    assert!(!out.exists(), "{source}: left {}", out.display());
}

fn excerpt(text: &str) -> String {
    text.chars().take(2000).collect()
}

/// Every entry under `dir` (files and folders, recursively).
fn entries(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    if let Ok(read) = std::fs::read_dir(dir) {
        for entry in read.flatten() {
            found.push(entry.path());
            if entry.path().is_dir() {
                found.extend(entries(&entry.path()));
            }
        }
    }
    found.sort();
    found
}

const GIB: u64 = 1 << 30;

/// Eight 12000×12000 PNGs of 420 KB each (Pillow), in a folder: decoded one at a time and resized
/// as decoded, so the peak is one bomb, not eight; under a 2 GiB address space either read or
/// refused in one line, never aborted. The same images as an `hf:` Image column (pyarrow).
#[test]
fn decompression_bombs_cost_one_image_not_all() {
    let Some(python) = python("decompression_bombs_cost_one_image_not_all") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    make(
        &python,
        dir.path(),
        r#"
import io, os, shutil
from PIL import Image
import pyarrow as pa, pyarrow.parquet as pq
os.makedirs('DIR/bombs/a'); os.makedirs('DIR/bombs/b')
Image.new('RGB', (12000, 12000)).save('DIR/bombs/a/x0.png')
for k in range(1, 6): shutil.copy('DIR/bombs/a/x0.png', f'DIR/bombs/a/x{k}.png')
for k in range(2): shutil.copy('DIR/bombs/a/x0.png', f'DIR/bombs/b/y{k}.png')
png = open('DIR/bombs/a/x0.png', 'rb').read()
image = pa.struct([('bytes', pa.binary()), ('path', pa.string())])
for split, count in [('train', 4), ('test', 2)]:
    os.makedirs(f'DIR/hf/default/{split}')
    table = pa.table({'image': pa.array([{'bytes': png, 'path': None}] * count, type=image),
                      'label': pa.array([k % 2 for k in range(count)], type=pa.int64())})
    pq.write_table(table, f'DIR/hf/default/{split}/0000.parquet')
"#,
    );
    for source in ["folder:bombs", "hf:hf#image=image"] {
        let (kind, path) = source.split_once(':').unwrap();
        let spec = format!("{kind}:{}", dir.path().join(path).display());
        let split = [
            "data",
            "split",
            "--dataset",
            &spec,
            "--pretrain-n",
            "1",
            "--n",
            "2",
        ];
        let free = run(&split, &cache, None);
        assert_eq!(free.code, Some(0), "{source}: {}", excerpt(&free.stderr));
        assert!(
            free.peak_bytes < 3 * GIB / 2,
            "{source}: peak {} MB",
            free.peak_bytes >> 20
        );
        let limited = run(&split, &cache, Some(2 * GIB));
        eprintln!(
            "{source}: peak {} MB unlimited; under prlimit --as 2 GiB exit {:?}, peak {} MB",
            free.peak_bytes >> 20,
            limited.code,
            limited.peak_bytes >> 20
        );
        match limited.code {
            Some(0) => {}
            _ => assert_refused(source, &limited, &["12000×12000"]),
        }
    }
}

/// An npz member whose header declares 2⁶⁰ labels, one inflating past what the process may take
/// under 2 GiB, and bool images: each refused in one line naming the file and the array, by every
/// command that reads it, before anything is allocated.
#[test]
fn npz_headers_are_checked_before_anything_is_allocated() {
    let Some(python) = python("npz_headers_are_checked_before_anything_is_allocated") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    make(
        &python,
        dir.path(),
        r#"
import os, zipfile, numpy as np
def save(root, images, labels, **kw):
    os.makedirs(f'{root}/medmnist', exist_ok=True)
    arrays = {}
    for s, n in [('train', 40), ('val', 8), ('test', 8)]:
        arrays[f'{s}_images'] = images(n)
        arrays[f'{s}_labels'] = labels(n)
    np.savez_compressed(f'{root}/medmnist/dermamnist.npz', **arrays)
# 1. train_labels' header rewritten to declare 2**60 rows.
save('DIR/liar', lambda n: np.zeros((n, 28, 28, 3), np.uint8), lambda n: np.zeros((n, 1), np.uint8))
src = 'DIR/liar/medmnist/dermamnist.npz'
with zipfile.ZipFile(src) as z: members = {m: z.read(m) for m in z.namelist()}
npy = members['train_labels.npy']
npy = npy.replace(b"(40, 1)", b"(1152921504606846976, 1)")
members['train_labels.npy'] = npy
with zipfile.ZipFile(src, 'w', zipfile.ZIP_DEFLATED) as z:
    for m, b in members.items(): z.writestr(m, b)
# 2. 1.1 GB of zeros in a few MB.
big = lambda n: np.zeros((1_400_000 if n == 40 else n, 28, 28), np.uint8)
save('DIR/inflating', big, lambda n: np.zeros((1_400_000 if n == 40 else n, 1), np.uint8))
# 3. bool images.
save('DIR/bools', lambda n: np.zeros((n, 28, 28), bool), lambda n: np.zeros((n, 1), np.uint8))
"#,
    );
    let root = |name: &str| dir.path().join(name).to_str().unwrap().to_string();
    for (case, name, needles, limit) in [
        (
            "declared 2⁶⁰ labels",
            "liar",
            vec!["dermamnist.npz", "train_labels", "declares shape"],
            None,
        ),
        (
            "bool images",
            "bools",
            vec!["dermamnist.npz", "train_images", "bool"],
            None,
        ),
        (
            "1.1 GB inflated under 2 GiB",
            "inflating",
            vec!["dermamnist.npz", "train_images"],
            Some(2 * GIB),
        ),
    ] {
        let out = dir.path().join("out");
        for args in [
            vec![
                "data",
                "split",
                "--dataset",
                "dermamnist",
                "--pretrain-n",
                "4",
                "--data-dir",
                &root(name),
            ],
            vec![
                "finetune",
                "--dataset",
                "dermamnist",
                "--eta",
                "0.2",
                "--data-dir",
                &root(name),
                "--out",
                out.to_str().unwrap(),
            ],
        ] {
            // Under the address-space limit, finetune refuses on its memory plan before it reads
            // any data (one line too, naming the limit): the data split is the command that reads.
            if limit.is_some() && args[0] == "finetune" {
                let ended = run(&args, &cache, limit);
                assert_refused(&format!("{case}: finetune"), &ended, &["RLIMIT_AS"]);
                continue;
            }
            let ended = run(&args, &cache, limit);
            assert_refused(&format!("{case}: {}", args[0]), &ended, &needles);
            assert!(!out.exists(), "{case}: left {}", out.display());
            if limit.is_some() {
                eprintln!("{case}: {} peak {} MB", args[0], ended.peak_bytes >> 20);
            }
        }
    }
}

/// A 50 MB CSV cell is read at about its size, and a CSV header of 50 MB, a JSONL label that is
/// a 1.3 MB array and an object of 100 000 keys are quoted in lines of bounded length.
#[test]
fn huge_values_cost_their_size_and_are_quoted_short() {
    let Some(python) = python("huge_values_cost_their_size_and_are_quoted_short") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    make(
        &python,
        dir.path(),
        r#"
import csv, json
with open('DIR/long_cell.csv', 'w', newline='') as f:
    w = csv.writer(f); w.writerow(['text', 'label'])
    w.writerow(['word ' * 10_000_000, 'a'])
    for k in range(20): w.writerow([f'text {k}', 'ab'[k % 2]])
with open('DIR/long_header.csv', 'w', newline='') as f:
    w = csv.writer(f); w.writerow(['x' * 50_000_000, 'label']); w.writerow(['a', 'b'])
with open('DIR/array_label.jsonl', 'w') as f:
    f.write(json.dumps({'text': 'a', 'label': [0] * 430_000}) + '\n')
with open('DIR/many_keys.jsonl', 'w') as f:
    f.write(json.dumps({f'k{k}': k for k in range(100_000)}) + '\n')
"#,
    );
    let spec = |kind: &str, name: &str| format!("{kind}:{}", dir.path().join(name).display());
    let read = run(
        &["data", "verify", &spec("csv", "long_cell.csv")],
        &cache,
        None,
    );
    assert_eq!(read.code, Some(0), "{}", excerpt(&read.stderr));
    eprintln!(
        "a 50 MB cell: data verify peak {} MB",
        read.peak_bytes >> 20
    );
    assert!(
        read.peak_bytes < 600 << 20,
        "peak {} MB",
        read.peak_bytes >> 20
    );
    for (source, needles) in [
        (
            spec("csv", "long_header.csv"),
            vec!["long_header.csv", "no column \"text\"", "bytes in all"],
        ),
        (
            spec("jsonl", "array_label.jsonl"),
            vec!["array_label.jsonl", "line 1", "neither an integer"],
        ),
        (
            spec("jsonl", "many_keys.jsonl"),
            vec!["many_keys.jsonl", "no key \"text\"", "(100000 in all)"],
        ),
    ] {
        assert_finetune_refused(&source, dir.path(), &cache, &needles);
    }
}

/// Empty and whitespace-only texts are refused at load, naming the file and the line (CSV by
/// Python's csv, with its CRLF line ends, and JSONL); nothing is left on disk.
#[test]
fn empty_texts_are_refused_at_load_by_file_and_line() {
    let Some(python) = python("empty_texts_are_refused_at_load_by_file_and_line") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    make(
        &python,
        dir.path(),
        r#"
import csv, json
with open('DIR/empty.csv', 'w', newline='') as f:
    w = csv.writer(f); w.writerow(['text', 'label'])
    w.writerow(['good', 'a']); w.writerow(['a "quoted"\nsecond line', 'b']); w.writerow(['', 'a'])
with open('DIR/blank.jsonl', 'w') as f:
    f.write(json.dumps({'text': 'fine', 'label': 1}) + '\n')
    f.write(json.dumps({'text': '  \t ', 'label': 2}) + '\n')
"#,
    );
    // The empty cell is on line 5: the quoted field before it spans lines 3 and 4.
    for (source, needles) in [
        ("csv:empty.csv", vec!["empty.csv", "line 5: an empty text"]),
        (
            "jsonl:blank.jsonl",
            vec!["blank.jsonl", "line 2: an empty text"],
        ),
    ] {
        let (kind, name) = source.split_once(':').unwrap();
        let spec = format!("{kind}:{}", dir.path().join(name).display());
        assert_finetune_refused(&spec, dir.path(), &cache, &needles);
        assert!(
            entries(&cache).is_empty(),
            "{source}: left {:?}",
            entries(&cache)
        );
    }
}

/// Every `[optimizer]` value AdamW cannot train with, and TOML values of the wrong range, are
/// refused naming the key, before any work.
#[test]
fn settings_out_of_range_are_refused_by_key() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let csv = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/own/reviews.csv");
    let cases = [
        (
            "[optimizer]\nlearning_rate = -0.001\n",
            "[optimizer] learning_rate",
        ),
        (
            "[optimizer]\nlearning_rate = 1e30\n",
            "[optimizer] learning_rate",
        ),
        ("[optimizer]\nbeta1 = 1.5\n", "[optimizer] beta1"),
        ("[optimizer]\nbeta2 = -2.0\n", "[optimizer] beta2"),
        ("[optimizer]\nepsilon = 0.0\n", "[optimizer] epsilon"),
        (
            "[optimizer]\nmax_grad_norm = -1.0\n",
            "[optimizer] max_grad_norm",
        ),
        (
            "[optimizer]\nweight_decay = -0.1\n",
            "[optimizer] weight_decay",
        ),
        (
            "[optimizer]\nlearning_rate = nan\n",
            "key `[optimizer] learning_rate`: nan and inf",
        ),
        ("epochs = -5\n", "key `epochs`"),
        ("seed = -1\n", "key `seed`"),
        ("device = \"tpu\"\n", "key `device`"),
        (
            "authors_noise_draw = \"float64\"\n",
            "key `authors_noise_draw`",
        ),
    ];
    for (text, needle) in cases {
        let config = dir.path().join("run.toml");
        std::fs::write(
            &config,
            format!("dataset = \"csv:{}\"\neta = 0.2\n{text}", csv.display()),
        )
        .unwrap();
        let out = dir.path().join("out");
        let ended = run(
            &[
                "finetune",
                "--config",
                config.to_str().unwrap(),
                "--out",
                out.to_str().unwrap(),
            ],
            &cache,
            None,
        );
        assert_refused(text, &ended, &[needle]);
        assert!(!out.exists(), "{text}: left {}", out.display());
    }
    // A grid's list holding a value twice is refused as finetune's is, not merged.
    let out = dir.path().join("grid");
    let ended = run(
        &[
            "reproduce",
            "table2",
            "--datasets",
            &format!("csv:{}", csv.display()),
            "--etas",
            "0.2,0.2",
            "--out",
            out.to_str().unwrap(),
        ],
        &cache,
        None,
    );
    assert_refused("--etas 0.2,0.2", &ended, &["--etas: 0.2 is given twice"]);
    assert!(!out.exists());
}

/// The smaller traps: a file name with a newline, test-only classes, zero-padded and huge integer
/// classes, duplicate headers, unsigned Parquet labels (pandas), a ClassLabel without names,
/// `#config=..`, entries beside train/ and test/, and the MedMNIST+ fetch hint.
#[test]
fn the_smaller_traps_read_right_or_are_refused_in_one_line() {
    let Some(python) = python("the_smaller_traps_read_right_or_are_refused_in_one_line") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    make(
        &python,
        dir.path(),
        r#"
import csv, json, os, numpy as np, pandas as pd
import pyarrow as pa, pyarrow.parquet as pq
from PIL import Image
def rows(path, header, rows):
    with open(path, 'w', newline='') as f:
        w = csv.writer(f); w.writerow(header); w.writerows(rows)
os.makedirs('DIR/testonly')
rows('DIR/testonly/train.csv', ['text', 'label'], [[f't{k}', 'ab'[k % 2]] for k in range(10)])
rows('DIR/testonly/test.csv', ['text', 'label'], [['u', 'a'], ['v', 'c']])
rows('DIR/padded.csv', ['text', 'label'], [[f't{k}', ['08', '09', '10'][k % 3]] for k in range(30)])
rows('DIR/huge.csv', ['text', 'label'], [[f't{k}', ['18446744073709551616', '-5'][k % 2]] for k in range(20)])
rows('DIR/twice.csv', ['text', 'label', 'text'], [['a', 'x', 'b']] * 10)
os.makedirs('DIR/uint/default/train')
pd.DataFrame({'text': [f't{k}' for k in range(20)], 'label': np.array([k % 2 for k in range(20)], np.uint8)}).to_parquet('DIR/uint/default/train/0000.parquet')
table = pa.table({'text': [f't{k}' for k in range(20)], 'label': pa.array([k % 2 for k in range(20)], pa.int64())})
meta = {'info': {'features': {'text': {'_type': 'Value'}, 'label': {'_type': 'ClassLabel', 'names': []}}}}
table = table.replace_schema_metadata({'huggingface': json.dumps(meta)})
os.makedirs('DIR/nonames/default/train'); pq.write_table(table, 'DIR/nonames/default/train/0000.parquet')
for c in ['cat', 'dog']:
    os.makedirs(f'DIR/newline/{c}')
    for k in range(5): Image.new('L', (8, 8), k).save(f'DIR/newline/{c}/{k}.png')
open('DIR/newline/dog/bad\nname.png', 'w').write('not a png')
for part in ['train', 'test', 'val']:
    for c in ['08', '09', '10']:
        os.makedirs(f'DIR/split/{part}/{c}')
        for k in range(3): Image.new('L', (8, 8), k).save(f'DIR/split/{part}/{c}/{k}.png')
for c in ['08', '09', '10']:
    os.makedirs(f'DIR/padded_folder/{c}')
    for k in range(5): Image.new('L', (8, 8), k).save(f'DIR/padded_folder/{c}/{k}.png')
os.makedirs('DIR/medplus/medmnist')
np.savez_compressed('DIR/medplus/medmnist/dermamnist.npz', train_images=np.zeros((4, 28, 28, 3), np.uint8))
"#,
    );
    let spec = |kind: &str, name: &str| format!("{kind}:{}", dir.path().join(name).display());
    // Read right: data verify says ok, with the classes in the documented order.
    for (source, classes) in [
        (spec("csv", "padded.csv"), "(08, 09, 10)"),
        (spec("csv", "huge.csv"), "(-5, 18446744073709551616)"),
        (spec("hf", "uint"), "(0, 1)"),
        (spec("hf", "nonames"), "(0, 1)"),
        (spec("folder", "padded_folder"), "(08, 09, 10)"),
    ] {
        let ended = run(&["data", "verify", &source], &cache, None);
        assert_eq!(ended.code, Some(0), "{source}: {}", excerpt(&ended.stderr));
        assert!(ended.stdout.contains(classes), "{source}: {}", ended.stdout);
    }
    // Refused in one line.
    for (source, needles) in [
        (
            spec("csv", "testonly"),
            vec![
                "test.csv",
                "a test label the training split does not have (\"c\")",
            ],
        ),
        (
            spec("csv", "twice.csv"),
            vec!["twice.csv", "names 2 columns \"text\""],
        ),
        (
            spec("folder", "newline"),
            vec!["bad\\nname.png", "not an image"],
        ),
        (
            spec("folder", "split"),
            vec!["split/val", "beside train/ and test/"],
        ),
        (
            format!("{}#config=..", spec("hf", "uint")),
            vec!["#config=\"..\""],
        ),
    ] {
        assert_finetune_refused(&source, dir.path(), &cache, &needles);
    }
    let root = dir.path().join("medplus");
    let ended = run(
        &[
            "data",
            "split",
            "--dataset",
            "dermamnist_128",
            "--pretrain-n",
            "4",
            "--data-dir",
            root.to_str().unwrap(),
        ],
        &cache,
        None,
    );
    assert_refused(
        "dermamnist_128 beside dermamnist",
        &ended,
        &[
            "dermamnist_128.npz",
            "datasets/medmnist.toml",
            "data fetch dermamnist_128",
        ],
    );
}

/// A text is cut before it is tokenized, and the cut never changes the ids: a 300 KB text and a
/// 50 MB one give the ids the tokenizer gives their whole text (a text of one long word, which
/// no cut can bound, too).
#[test]
fn a_long_text_is_cut_before_tokenizing_without_changing_its_ids() {
    let Some(models) =
        common::models_root("a_long_text_is_cut_before_tokenizing_without_changing_its_ids")
    else {
        return;
    };
    use benign_attention::encoder::text::{MAX_LENGTH, TextPreprocessor};
    let path = models.join("sentence-transformers/all-MiniLM-L6-v2/tokenizer.json");
    let preprocessor = TextPreprocessor::from_file(&path, MAX_LENGTH, false).unwrap();
    let raw = tokenizers::Tokenizer::from_file(&path).unwrap();
    let whole_ids = |text: &str| -> Vec<u32> {
        let encoding = raw.encode(text, false).unwrap();
        let mut ids: Vec<u32> = encoding
            .get_ids()
            .iter()
            .copied()
            .take(MAX_LENGTH)
            .collect();
        let pad = raw.token_to_id("[PAD]").unwrap();
        ids.resize(MAX_LENGTH, pad);
        ids
    };
    let sentence = "Où est la gare? The quick brown fox jumps over 13 lazy dogs, naïvely. ";
    let medium = sentence.repeat(4_000);
    let ids = preprocessor
        .encode(std::slice::from_ref(&medium))
        .unwrap()
        .input_ids
        .remove(0);
    assert_eq!(ids, whole_ids(&medium));
    // Long whitespace runs and a word straddling the first cut.
    let spaced = format!("{}{}", "a ".repeat(2_040), "x".repeat(5_000) + " tail");
    let ids = preprocessor
        .encode(std::slice::from_ref(&spaced))
        .unwrap()
        .input_ids
        .remove(0);
    assert_eq!(ids, whole_ids(&spaced));
    let word = "y".repeat(20_000);
    let ids = preprocessor
        .encode(std::slice::from_ref(&word))
        .unwrap()
        .input_ids
        .remove(0);
    assert_eq!(ids, whole_ids(&word));
    // 50 MB: the ids of its first megabyte (tokenizing all of it here would take the memory the
    // cut saves).
    let huge = "word ".repeat(10_000_000);
    let ids = preprocessor
        .encode(std::slice::from_ref(&huge))
        .unwrap()
        .input_ids
        .remove(0);
    assert_eq!(ids, whole_ids(&huge[..1 << 20]));
    // Tokenized whole, the 50 MB text took 4.5 GB; cut, this process stays near its size.
    // SAFETY: fills the local.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    let peak = usage.ru_maxrss as u64 * 1024;
    assert!(peak < 3 * GIB / 2, "peak {} MB", peak >> 20);
}
