//! The feature cache with the tiny fixture ViT: hits do no backbone work, corrupt shards are
//! rebuilt with a warning, leftovers of a killed extraction are not trusted, and features of
//! another backbone found in a backbone's folder are an error.

use std::path::{Path, PathBuf};

use benign_attention::data::{ImageSet, Inputs, Split};
use benign_attention::encoder::cache::{Contents, FeatureCache};
use benign_attention::encoder::{Backbone, BackboneFiles, TextOptions};
use candle_core::Device;

mod common;

fn tiny_vit(dir: &Path) -> Backbone {
    let fixture = common::fixtures().join("tiny_vit");
    let preprocessor = dir.join("preprocessor_config.json");
    std::fs::write(
        &preprocessor,
        r#"{"size": {"height": 32, "width": 32}, "resample": 2}"#,
    )
    .unwrap();
    let files = BackboneFiles {
        id: "fixture/tiny-vit".into(),
        config: fixture.join("config.json"),
        weights: fixture.join("model.safetensors"),
        preprocessor: Some(preprocessor),
        tokenizer: None,
        source: "test fixture".into(),
    };
    Backbone::load(files, &Device::Cpu, TextOptions::default()).unwrap()
}

/// 12 pseudo-random 3×32×32 images whose release indices are not their positions.
fn images() -> Split {
    let count = 12;
    let pixels = (0..count * 3 * 32 * 32)
        .map(|k| ((k * 7919 + k / 97) % 256) as u8)
        .collect();
    Split {
        inputs: Inputs::Images(ImageSet {
            count,
            channels: 3,
            height: 32,
            width: 32,
            pixels,
        }),
        labels: vec![0; count],
        release_index: (0..count).map(|i| 100 + 3 * i).collect(),
    }
}

fn shard_files(root: &Path) -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(&path, out)
            } else {
                out.push(path)
            }
        }
    }
    let mut out = Vec::new();
    if root.exists() {
        walk(root, &mut out);
    }
    out.sort();
    out
}

#[test]
fn second_request_does_no_backbone_work_and_subsets_come_from_the_cache() {
    let dir = tempfile::tempdir().unwrap();
    let backbone = tiny_vit(dir.path());
    let cache = FeatureCache::new(dir.path().join("cache"));
    let data = images();
    let all: Vec<usize> = (0..12).collect();
    let (first, stats) = cache
        .features(
            &backbone,
            "toy",
            "train",
            &data,
            &all,
            Contents::Full,
            5,
            &mut |_| {},
        )
        .unwrap();
    assert_eq!((stats.computed, stats.from_cache), (12, 0));
    assert_eq!(backbone.forward_batches(), 3);
    assert_eq!(first.layer_inputs.as_ref().unwrap().dims(), [12, 17, 32]);

    // The same key again, and a reordered subset with fewer contents: no backbone work at all.
    let (again, stats) = cache
        .features(
            &backbone,
            "toy",
            "train",
            &data,
            &all,
            Contents::Full,
            5,
            &mut |_| {},
        )
        .unwrap();
    assert_eq!((stats.computed, stats.from_cache), (0, 12));
    let subset = [7, 2, 11];
    let (part, _) = cache
        .features(
            &backbone,
            "toy",
            "train",
            &data,
            &subset,
            Contents::Cls,
            5,
            &mut |_| {},
        )
        .unwrap();
    assert_eq!(
        backbone.forward_batches(),
        3,
        "a cache hit ran the backbone"
    );
    assert_eq!(
        again.cls.to_vec2::<f32>().unwrap(),
        first.cls.to_vec2::<f32>().unwrap()
    );
    assert_eq!(part.release_index, vec![121, 106, 133]);
    let expected: Vec<Vec<f32>> = subset
        .iter()
        .map(|&i| first.cls.get(i).unwrap().to_vec1().unwrap())
        .collect();
    assert_eq!(part.cls.to_vec2::<f32>().unwrap(), expected);
    assert!(part.layer_inputs.is_none());

    // The cached features are the backbone's own.
    let direct = backbone.encode(&data.inputs, &[7]).unwrap();
    assert_eq!(direct.cls.to_vec2::<f32>().unwrap()[0], expected[0]);
}

#[test]
fn a_corrupt_shard_is_rebuilt_with_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let backbone = tiny_vit(dir.path());
    let root = dir.path().join("cache");
    let cache = FeatureCache::new(root.clone());
    let data = images();
    let all: Vec<usize> = (0..12).collect();
    let (first, _) = cache
        .features(
            &backbone,
            "toy",
            "test",
            &data,
            &all,
            Contents::Full,
            12,
            &mut |_| {},
        )
        .unwrap();
    let shard = shard_files(&root)
        .into_iter()
        .find(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .unwrap();
    let bytes = std::fs::read(&shard).unwrap();
    std::fs::write(&shard, &bytes[..bytes.len() / 3]).unwrap();
    let (rebuilt, stats) = cache
        .features(
            &backbone,
            "toy",
            "test",
            &data,
            &all,
            Contents::Full,
            12,
            &mut |_| {},
        )
        .unwrap();
    assert_eq!(stats.warnings.len(), 1, "{:?}", stats.warnings);
    assert!(
        stats.warnings[0].contains("rebuilding"),
        "{}",
        stats.warnings[0]
    );
    assert_eq!(stats.computed, 12);
    assert_eq!(
        rebuilt.cls.to_vec2::<f32>().unwrap(),
        first.cls.to_vec2::<f32>().unwrap()
    );
}

#[test]
fn leftovers_of_a_killed_extraction_are_not_trusted() {
    let dir = tempfile::tempdir().unwrap();
    let backbone = tiny_vit(dir.path());
    let root = dir.path().join("cache");
    let cache = FeatureCache::new(root.clone());
    let data = images();
    let all: Vec<usize> = (0..12).collect();
    cache
        .features(
            &backbone,
            "toy",
            "train",
            &data,
            &all,
            Contents::Cls,
            12,
            &mut |_| {},
        )
        .unwrap();
    // A kill after the tensors were renamed but before the sidecar: delete the sidecar.
    let files = shard_files(&root);
    let sidecar = files
        .iter()
        .find(|p| p.extension().is_some_and(|e| e == "json"))
        .unwrap();
    let folder = sidecar.parent().unwrap().to_path_buf();
    std::fs::remove_file(sidecar).unwrap();
    // A kill mid-write: a temporary file with half a shard.
    std::fs::write(folder.join(".tmp-abc.safetensors"), b"partial").unwrap();
    // A sidecar that does not name its file's key is ignored too.
    std::fs::write(
        folder.join("shard-0000000000000000.json"),
        b"{\"version\": 1}",
    )
    .unwrap();
    let before = backbone.forward_batches();
    let (_, stats) = cache
        .features(
            &backbone,
            "toy",
            "train",
            &data,
            &all,
            Contents::Cls,
            12,
            &mut |_| {},
        )
        .unwrap();
    assert_eq!(stats.computed, 12);
    assert_eq!(backbone.forward_batches(), before + 1);
}

#[test]
fn features_of_another_backbone_in_its_folder_are_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let backbone = tiny_vit(dir.path());
    let root = dir.path().join("cache");
    let cache = FeatureCache::new(root.clone());
    let data = images();
    let request = |b: &Backbone| {
        cache.features(
            b,
            "toy",
            "train",
            &data,
            &[0, 1],
            Contents::Cls,
            5,
            &mut |_| {},
        )
    };
    request(&backbone).unwrap();
    // Another checkpoint under the same id (new weights) whose folder holds the first one's
    // shards, as a copied cache would.
    let mut other = tiny_vit(dir.path());
    other.weights_sha256 = "f".repeat(64);
    let first = std::fs::read_dir(&root)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let name = first.file_name().unwrap().to_str().unwrap().to_string();
    let renamed = root.join(format!("{}{}", &name[..name.len() - 12], "f".repeat(12)));
    std::fs::rename(&first, &renamed).unwrap();
    let err = format!(
        "{:#}",
        request(&other).err().expect("a mixed-up cache is an error")
    );
    assert!(err.contains("cached features of another backbone"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert_eq!(other.forward_batches(), 0);
}
