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
    tiny_vit_with(dir, common::fixtures().join("tiny_vit").join("config.json"))
}

fn tiny_vit_with(dir: &Path, config: PathBuf) -> Backbone {
    let fixture = common::fixtures().join("tiny_vit");
    let preprocessor = dir.join("preprocessor_config.json");
    std::fs::write(
        &preprocessor,
        r#"{"size": {"height": 32, "width": 32}, "resample": 2}"#,
    )
    .unwrap();
    let files = BackboneFiles {
        id: "fixture/tiny-vit".into(),
        config,
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
    let cache = FeatureCache::open(dir.path().join("cache")).unwrap();
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
    let inputs = first.layer_inputs.as_ref().unwrap();
    assert_eq!((inputs.len(), inputs.tokens(), inputs.dim()), (12, 17, 32));
    let batch = inputs.batch(&[0, 11], &Device::Cpu).unwrap();
    assert_eq!(batch.inputs.dims(), [2, 17, 32]);

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
    let cache = FeatureCache::open(root.clone()).unwrap();
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
    let cache = FeatureCache::open(root.clone()).unwrap();
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
    assert!(
        !folder.join(".tmp-abc.safetensors").exists(),
        "the killed writer's temporary file was swept"
    );
}

#[test]
fn features_of_another_backbone_in_its_folder_are_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let backbone = tiny_vit(dir.path());
    let root = dir.path().join("cache");
    let cache = FeatureCache::open(root.clone()).unwrap();
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

fn request(
    cache: &FeatureCache,
    backbone: &Backbone,
    split: &str,
    data: &Split,
) -> (
    benign_attention::encoder::cache::Features,
    benign_attention::encoder::cache::CacheStats,
) {
    let all: Vec<usize> = (0..data.len()).collect();
    cache
        .features(
            backbone,
            "toy",
            split,
            data,
            &all,
            Contents::Full,
            12,
            &mut |_| {},
        )
        .unwrap()
}

#[test]
fn a_sample_whose_bytes_changed_is_recomputed_not_served() {
    let dir = tempfile::tempdir().unwrap();
    let backbone = tiny_vit(dir.path());
    let cache = FeatureCache::open(dir.path().join("cache")).unwrap();
    let data = images();
    let (before, _) = request(&cache, &backbone, "test", &data);
    // The data file replaced: sample 3 has other pixels under the same release index.
    let mut replaced = data.clone();
    if let Inputs::Images(set) = &mut replaced.inputs {
        let len = set.image_len();
        set.pixels[3 * len..4 * len]
            .iter_mut()
            .for_each(|p| *p = 255 - *p);
    }
    let (after, stats) = request(&cache, &backbone, "test", &replaced);
    assert_eq!(stats.computed, 1);
    let (b, a) = (
        before.cls.to_vec2::<f32>().unwrap(),
        after.cls.to_vec2::<f32>().unwrap(),
    );
    assert_ne!(b[3], a[3]);
    assert_eq!(b[0], a[0]);
}

#[test]
fn another_config_json_is_another_cache() {
    let dir = tempfile::tempdir().unwrap();
    let data = images();
    let cache = FeatureCache::open(dir.path().join("cache")).unwrap();
    let fixture = common::fixtures().join("tiny_vit").join("config.json");
    request(&cache, &tiny_vit(dir.path()), "test", &data);
    // Fewer layers read from the same weights: other features.
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&fixture).unwrap()).unwrap();
    let layers = config["num_hidden_layers"].as_u64().unwrap();
    assert!(layers > 1);
    config["num_hidden_layers"] = (layers - 1).into();
    let edited = dir.path().join("config.json");
    std::fs::write(&edited, config.to_string()).unwrap();
    let (_, stats) = request(&cache, &tiny_vit_with(dir.path(), edited), "test", &data);
    assert_eq!(stats.computed, 12);
}

/// Every file of a shard folder, found by its extension.
fn shard_of(root: &Path, extension: &str) -> PathBuf {
    shard_files(root)
        .into_iter()
        .find(|p| p.extension().is_some_and(|e| e == extension))
        .unwrap()
}

#[test]
fn a_shard_with_non_finite_values_is_rebuilt_even_with_a_matching_checksum() {
    let dir = tempfile::tempdir().unwrap();
    let backbone = tiny_vit(dir.path());
    let root = dir.path().join("cache");
    let cache = FeatureCache::open(root.clone()).unwrap();
    let data = images();
    request(&cache, &backbone, "test", &data);
    let (tensors_path, sidecar_path) = (shard_of(&root, "safetensors"), shard_of(&root, "json"));
    let mut tensors = candle_core::safetensors::load(&tensors_path, &Device::Cpu).unwrap();
    let cls = tensors["cls"].clone();
    let poisoned = (cls.clone() * f64::NAN).unwrap();
    tensors.insert("cls".into(), poisoned);
    candle_core::safetensors::save(&tensors, &tensors_path).unwrap();
    // The sidecar re-sealed to the poisoned tensor, as a consistent but wrong writer would.
    let digest = {
        use sha2::Digest;
        let bytes: Vec<u8> = tensors["cls"]
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap()
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let d = sha2::Sha256::digest(bytes);
        d.iter().map(|b| format!("{b:02x}")).collect::<String>()
    };
    let mut sidecar: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&sidecar_path).unwrap()).unwrap();
    sidecar["tensor_sha256"]["cls"] = digest.into();
    std::fs::write(&sidecar_path, sidecar.to_string()).unwrap();
    let (features, stats) = request(&cache, &backbone, "test", &data);
    assert_eq!(stats.computed, 12, "{:?}", stats.warnings);
    assert!(
        stats.warnings[0].contains("non-finite"),
        "{:?}",
        stats.warnings
    );
    assert_eq!(
        features.cls.to_vec2::<f32>().unwrap(),
        cls.to_vec2::<f32>().unwrap()
    );
}

#[test]
fn rows_of_another_split_are_not_served() {
    let dir = tempfile::tempdir().unwrap();
    let backbone = tiny_vit(dir.path());
    let root = dir.path().join("cache");
    let cache = FeatureCache::open(root.clone()).unwrap();
    let data = images();
    request(&cache, &backbone, "train", &data);
    // The train folder's shard copied into the test folder under its own name.
    let (tensors, sidecar) = (shard_of(&root, "safetensors"), shard_of(&root, "json"));
    let test_dir = tensors.parent().unwrap().with_file_name("test");
    std::fs::create_dir_all(&test_dir).unwrap();
    for file in [&tensors, &sidecar] {
        std::fs::copy(file, test_dir.join(file.file_name().unwrap())).unwrap();
    }
    let (_, stats) = request(&cache, &backbone, "test", &data);
    assert_eq!(stats.computed, 12);
}

#[test]
fn concurrent_writers_compute_each_sample_once() {
    let dir = tempfile::tempdir().unwrap();
    let backbone = tiny_vit(dir.path());
    let root = dir.path().join("cache");
    let data = images();
    let computed: usize = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..2)
            .map(|_| {
                scope.spawn(|| {
                    // Each worker opens the cache on its own, as two processes would.
                    let cache = FeatureCache::open(root.clone()).unwrap();
                    request(&cache, &backbone, "test", &data).1.computed
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).sum()
    });
    assert_eq!(computed, 12);
}

#[test]
fn an_unwritable_cache_is_refused_when_opened() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, "x").unwrap();
    let err = FeatureCache::open(file.join("cache"))
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("cannot be written"), "{err}");
}

#[test]
fn tampered_layer_inputs_are_an_error_when_read() {
    let dir = tempfile::tempdir().unwrap();
    let backbone = tiny_vit(dir.path());
    let root = dir.path().join("cache");
    let cache = FeatureCache::open(root.clone()).unwrap();
    let data = images();
    request(&cache, &backbone, "test", &data);
    // Flip the last bytes of the layer inputs: the last sample's rows.
    let path = shard_of(&root, "safetensors");
    let mut bytes = std::fs::read(&path).unwrap();
    let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + header_len]).unwrap();
    let end = 8 + header_len + header["layer_inputs"]["data_offsets"][1].as_u64().unwrap() as usize;
    bytes[end - 8..end].iter_mut().for_each(|b| *b ^= 0x55);
    std::fs::write(&path, bytes).unwrap();
    let (features, _) = request(&cache, &backbone, "test", &data);
    let rows = features.layer_inputs.unwrap();
    assert!(rows.batch(&[0], &Device::Cpu).is_ok());
    let err = rows.batch(&[11], &Device::Cpu).err().unwrap().to_string();
    assert!(err.contains("digest"), "{err}");
}
