//! The hidden states entering the last layer, per sample, without holding a whole set in memory.
//!
//! The feature cache stores them ragged: a (Σᵢ Lᵢ, D) f32 tensor of every sample's first Lᵢ token
//! rows (its unpadded length; all T for images), beside the lengths. HF pads text on the right
//! and phase 2 never reads a padded position, so padding is neither stored nor read. A
//! [`LayerRows`] names where each sample's rows are, in a cached shard on disk or in memory, and
//! reads a batch of samples at a time: the test set of a paper-scale run (10 000 samples of
//! 197 × 768 floats) streams from the disk chunk by chunk, and only the n ≤ 1000 fine-tune samples
//! are made resident. Each sample's bytes are checked against the digest its shard's sidecar
//! recorded the first time they are read; later reads (every test evaluation, every epoch of head
//! mode's phase 1) are not hashed again, and must see the very file that was checked: a shard is
//! reopened only if its path still names the same file (device and inode), since shards are written
//! once and renamed into place, never modified. At most [`MAX_OPEN_ROW_FILES`] shards are held open
//! at once across the process, so a stack of a thousand runs holds no more descriptors than one.

use std::collections::{HashMap, VecDeque};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};

use anyhow::{Context, Result, bail, ensure};
use candle_core::{Device, Tensor};
use rayon::prelude::*;

/// Shard files the process holds open at once; the least recently opened is closed when another
/// is opened (stack planning keeps room for them, `train::stack_plan`).
pub const MAX_OPEN_ROW_FILES: usize = 32;

/// A file of rows, opened at its first read. A named file may be closed to bound the process's
/// descriptors ([`MAX_OPEN_ROW_FILES`]) and reopened later, provided its path still names the
/// file first opened; a file without a name (a spill) stays open while it is held.
#[derive(Debug)]
struct RowFile {
    path: PathBuf,
    open: Mutex<Option<Arc<std::fs::File>>>,
    /// (device, inode) of the file first opened at `path`.
    identity: OnceLock<(u64, u64)>,
    /// Whether it can be reopened by its path.
    named: bool,
}

/// The row files the process's sets read, by path: every set that reads a shard shares one
/// entry, so that a thousand seeds reading the same ~20 shards share their checks. An entry
/// lives while a set holds it.
static SHARED: Mutex<Vec<(PathBuf, Weak<RowFile>)>> = Mutex::new(Vec::new());

/// The named row files holding a descriptor, oldest first.
static OPEN: Mutex<VecDeque<Weak<RowFile>>> = Mutex::new(VecDeque::new());

impl RowFile {
    /// The process's row file at `path`: the one another set already holds, else a new one.
    fn shared(path: PathBuf) -> Arc<Self> {
        let mut files = SHARED.lock().unwrap_or_else(PoisonError::into_inner);
        files.retain(|(_, file)| file.strong_count() > 0);
        if let Some(file) = files
            .iter()
            .find(|(held, _)| *held == path)
            .and_then(|(_, file)| file.upgrade())
        {
            return file;
        }
        let file = Arc::new(Self {
            path: path.clone(),
            open: Mutex::new(None),
            identity: OnceLock::new(),
            named: true,
        });
        files.push((path, Arc::downgrade(&file)));
        file
    }

    /// A file already open (one without a name); `path` only names it in messages.
    fn held(path: PathBuf, file: std::fs::File) -> Arc<Self> {
        Arc::new(Self {
            path,
            open: Mutex::new(Some(Arc::new(file))),
            identity: OnceLock::new(),
            named: false,
        })
    }

    fn slot(&self) -> std::sync::MutexGuard<'_, Option<Arc<std::fs::File>>> {
        self.open.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The open file: held, or (re)opened by its path, which must still name the same file.
    fn file(self: &Arc<Self>) -> Result<Arc<std::fs::File>> {
        if let Some(file) = self.slot().as_ref() {
            return Ok(Arc::clone(file));
        }
        ensure!(
            self.named,
            "{}: the temporary file was closed",
            self.path.display()
        );
        let (file, _) = crate::io::open_input(&self.path, crate::io::limits::TENSORS)?;
        let identity = {
            use std::os::unix::fs::MetadataExt;
            let meta = file
                .metadata()
                .with_context(|| format!("{}: cannot stat", self.path.display()))?;
            (meta.dev(), meta.ino())
        };
        if *self.identity.get_or_init(|| identity) != identity {
            bail!(
                "{}: replaced by another file since its rows were checked; run again to read the new one",
                self.path.display()
            );
        }
        let file = Arc::new(file);
        {
            // Two threads may open it at once; the first one's handle is kept.
            let mut slot = self.slot();
            if let Some(first) = slot.as_ref() {
                return Ok(Arc::clone(first));
            }
            *slot = Some(Arc::clone(&file));
        }
        let mut open = OPEN.lock().unwrap_or_else(PoisonError::into_inner);
        open.retain(|held| held.strong_count() > 0);
        open.push_back(Arc::downgrade(self));
        while open.len() > MAX_OPEN_ROW_FILES {
            if let Some(oldest) = open.pop_front().and_then(|held| held.upgrade()) {
                // Readers still holding its handle finish with it; the descriptor closes after.
                oldest.slot().take();
            }
        }
        Ok(file)
    }
}

/// A sample's rows in a file: `tokens` rows of `dim` f32 starting at byte `offset`.
#[derive(Clone, Debug)]
struct OnDisk {
    file: Arc<RowFile>,
    offset: u64,
    digest: String,
    /// Whether these bytes of the held file matched `digest` once (shared by every copy).
    verified: Arc<AtomicBool>,
}

#[derive(Clone, Debug)]
enum Storage {
    /// Per sample, its place in a shard file.
    Disk(Vec<OnDisk>),
    /// Every sample's rows back to back; `starts[i]` is sample i's first row.
    Memory {
        values: Arc<Vec<f32>>,
        starts: Vec<usize>,
    },
}

/// The last layer's inputs of a list of samples (in request order).
#[derive(Clone, Debug)]
pub struct LayerRows {
    /// Unpadded tokens per sample.
    lengths: Vec<usize>,
    /// Tokens per sample before padding was cut (max_length for text, T for images).
    tokens: usize,
    dim: usize,
    storage: Storage,
}

/// Little-endian f32 values at byte `offset` of `file` into `out`: straight into the floats'
/// bytes where the machine is little-endian (every read of the streamed test set goes here).
fn read_f32s_at(file: &std::fs::File, offset: u64, out: &mut [f32]) -> std::io::Result<()> {
    #[cfg(target_endian = "little")]
    {
        // SAFETY: f32 has no invalid bit patterns and no padding; the byte view covers exactly
        // `out`, which it borrows mutably for the read.
        let bytes = unsafe {
            std::slice::from_raw_parts_mut(
                out.as_mut_ptr().cast::<u8>(),
                std::mem::size_of_val(out),
            )
        };
        file.read_exact_at(bytes, offset)
    }
    #[cfg(not(target_endian = "little"))]
    {
        let mut bytes = vec![0u8; out.len() * 4];
        file.read_exact_at(&mut bytes, offset)?;
        for (v, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
            *v = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        }
        Ok(())
    }
}

/// A batch read back on the host: (B, width, D) row-major, zero-padded, and the lengths.
pub struct HostBatch {
    pub values: Vec<f32>,
    pub width: usize,
    pub dim: usize,
    pub lengths: Vec<usize>,
}

/// A batch read back: (B, L, D) zero-padded to the batch's longest sample, and the lengths.
pub struct LayerBatch {
    pub inputs: Tensor,
    pub lengths: Vec<usize>,
}

impl LayerBatch {
    /// The 0/1 padding mask (B, L) that HF's attention takes, u32, on the inputs' device.
    pub fn mask(&self) -> Result<Tensor> {
        let width = self.inputs.dim(1)?;
        let mask: Vec<u32> = self
            .lengths
            .iter()
            .flat_map(|&len| (0..width).map(move |t| u32::from(t < len)))
            .collect();
        Ok(Tensor::from_vec(
            mask,
            (self.lengths.len(), width),
            self.inputs.device(),
        )?)
    }
}

/// 64-bit hex digest of a sample's f32 bytes, as the sidecar records it.
pub fn rows_digest(values: &[f32]) -> String {
    use sha2::Digest;
    let mut hasher = sha2::Sha256::new();
    // The same bytes as one update per float, in 4 KiB pieces: a 4-byte update per value cost
    // a third of the hashing, and every streamed read of the test set is hashed.
    let mut bytes = [0u8; 4096];
    for piece in values.chunks(bytes.len() / 4) {
        for (out, v) in bytes.chunks_exact_mut(4).zip(piece) {
            out.copy_from_slice(&v.to_le_bytes());
        }
        hasher.update(&bytes[..piece.len() * 4]);
    }
    crate::io::hex(&hasher.finalize()[..8])
}

impl LayerRows {
    /// Rows in shard files: per sample (file, byte offset of its first row, rows, digest).
    pub(crate) fn on_disk(
        samples: Vec<(Arc<PathBuf>, u64, usize, String)>,
        tokens: usize,
        dim: usize,
    ) -> Self {
        let lengths = samples.iter().map(|s| s.2).collect();
        let mut files: HashMap<PathBuf, Arc<RowFile>> = HashMap::new();
        let samples = samples
            .into_iter()
            .map(|(path, offset, _, digest)| OnDisk {
                file: Arc::clone(
                    files
                        .entry(path.to_path_buf())
                        .or_insert_with(|| RowFile::shared(path.to_path_buf())),
                ),
                offset,
                digest,
                verified: Arc::new(AtomicBool::new(false)),
            })
            .collect();
        Self {
            lengths,
            tokens,
            dim,
            storage: Storage::Disk(samples),
        }
    }

    /// Rows held in memory: `values` (N, T, D) cut to `lengths` per sample (for tests, benches
    /// and sets built in memory).
    pub fn from_padded(values: &Tensor, lengths: Vec<usize>) -> Result<Self> {
        let (n, tokens, dim) = values.dims3()?;
        ensure!(
            lengths.len() == n,
            "{} lengths for {n} samples",
            lengths.len()
        );
        let all: Vec<f32> = values.flatten_all()?.to_vec1()?;
        let mut kept = Vec::with_capacity(lengths.iter().sum::<usize>() * dim);
        let mut starts = Vec::with_capacity(n);
        for (i, &len) in lengths.iter().enumerate() {
            ensure!(
                len <= tokens,
                "length {len} of sample {i} exceeds {tokens} tokens"
            );
            starts.push(kept.len() / dim);
            kept.extend_from_slice(&all[i * tokens * dim..(i * tokens + len) * dim]);
        }
        Ok(Self {
            lengths,
            tokens,
            dim,
            storage: Storage::Memory {
                values: Arc::new(kept),
                starts,
            },
        })
    }

    pub fn len(&self) -> usize {
        self.lengths.len()
    }

    pub fn is_empty(&self) -> bool {
        self.lengths.is_empty()
    }

    pub fn dim(&self) -> usize {
        self.dim
    }

    pub fn tokens(&self) -> usize {
        self.tokens
    }

    pub fn lengths(&self) -> &[usize] {
        &self.lengths
    }

    /// A digest of every sample's rows and length, without reading shard rows: a shard's
    /// samples carry the digest their sidecar recorded, which every read checks, so it stands for
    /// their bytes; rows in memory are digested here.
    pub fn content_digest(&self) -> String {
        use sha2::Digest;
        let mut hasher = sha2::Sha256::new();
        hasher.update((self.dim as u64).to_le_bytes());
        for (i, &len) in self.lengths.iter().enumerate() {
            hasher.update((len as u64).to_le_bytes());
            let digest = match &self.storage {
                Storage::Disk(samples) => samples[i].digest.clone(),
                Storage::Memory { values, starts } => {
                    let start = starts[i] * self.dim;
                    rows_digest(&values[start..start + len * self.dim])
                }
            };
            hasher.update(digest.as_bytes());
        }
        crate::io::hex(&hasher.finalize())
    }

    /// Every sample read into memory once (the fine-tune set), checked as it is read.
    pub fn resident(&self) -> Result<Self> {
        if let Storage::Memory { .. } = self.storage {
            return Ok(self.clone());
        }
        let mut values = Vec::with_capacity(self.lengths.iter().sum::<usize>() * self.dim);
        let mut starts = Vec::with_capacity(self.len());
        for i in 0..self.len() {
            starts.push(values.len() / self.dim);
            self.read_sample(i, &mut values)?;
        }
        Ok(Self {
            lengths: self.lengths.clone(),
            tokens: self.tokens,
            dim: self.dim,
            storage: Storage::Memory {
                values: Arc::new(values),
                starts,
            },
        })
    }

    /// Appends sample i's rows to `out`.
    fn read_sample(&self, i: usize, out: &mut Vec<f32>) -> Result<()> {
        let first = out.len();
        out.resize(first + self.lengths[i] * self.dim, 0.0);
        self.read_sample_into(i, &mut out[first..])
    }

    /// Sample i's rows into `out`, which holds exactly that many values.
    fn read_sample_into(&self, i: usize, out: &mut [f32]) -> Result<()> {
        let len = self.lengths[i] * self.dim;
        debug_assert_eq!(out.len(), len);
        match &self.storage {
            Storage::Memory { values, starts } => {
                let start = starts[i] * self.dim;
                out.copy_from_slice(&values[start..start + len]);
            }
            Storage::Disk(samples) => {
                let sample = &samples[i];
                let path = &sample.file.path;
                let file = sample.file.file()?;
                read_f32s_at(&file, sample.offset, out)
                    .with_context(|| format!("{}: cannot read sample rows", path.display()))?;
                if !sample.verified.load(Ordering::Acquire) {
                    if rows_digest(out) != sample.digest {
                        bail!(
                            "{}: a sample's rows differ from the digest its sidecar recorded; delete the shard to rebuild it",
                            path.display()
                        );
                    }
                    sample.verified.store(true, Ordering::Release);
                }
            }
        }
        Ok(())
    }

    /// Samples `rows`, (B, L, D) zero-padded to the longest of them, on `device`.
    pub fn batch(&self, rows: &[usize], device: &Device) -> Result<LayerBatch> {
        let batch = self.host_batch(rows)?;
        Ok(LayerBatch {
            inputs: Tensor::from_vec(batch.values, (rows.len(), batch.width, self.dim), device)?,
            lengths: batch.lengths,
        })
    }

    /// `f(index, rows, length)` on each sample's unpadded rows (length × d), in order, one sample
    /// read at a time.
    pub fn for_each_sample(
        &self,
        mut f: impl FnMut(usize, &[f32], usize) -> Result<()>,
    ) -> Result<()> {
        for i in 0..self.len() {
            let batch = self.host_batch(&[i])?;
            f(i, &batch.values, batch.lengths[0])?;
        }
        Ok(())
    }

    /// [`Self::batch`] as host values, for the CPU's host pass.
    pub fn host_batch(&self, rows: &[usize]) -> Result<HostBatch> {
        Ok(self.host_batch_then(rows, Vec::new(), |_| ())?.0)
    }

    /// [`Self::host_batch`], with `then` applied to each sample's unpadded rows right after they
    /// are read, while they are still in that core's cache; what it returns, in batch order.
    /// The batch is written into `buffer` (an earlier batch's values, or empty): every value is
    /// read or set to the padding's 0, so nothing of the earlier batch remains, and a buffer
    /// long enough is not zeroed first (zeroing each streamed batch of 7 MB took a fifth of
    /// reading it at ViT-Ti's size).
    pub fn host_batch_then<T: Send>(
        &self,
        rows: &[usize],
        buffer: Vec<f32>,
        then: impl Fn(&mut [f32]) -> T + Sync,
    ) -> Result<(HostBatch, Vec<T>)> {
        if rows.is_empty() {
            bail!("an empty batch of layer inputs");
        }
        if let Some(&bad) = rows.iter().find(|&&r| r >= self.len()) {
            bail!("layer inputs: sample {bad} of {}", self.len());
        }
        let width = rows.iter().map(|&r| self.lengths[r]).max().unwrap_or(0);
        let mut values = buffer;
        let total = rows.len() * width * self.dim;
        if values.len() >= total {
            values.truncate(total);
        } else {
            values.resize(total, 0.0);
        }
        // A sample per thread of the current pool (phase 2's streamed test set: 48 samples of
        // 151 kB at ViT-Ti's size, read while the other core would otherwise wait).
        let results = values
            .par_chunks_mut((width * self.dim).max(1))
            .zip(rows)
            .map(|(padded, &r)| {
                let (sample, padding) = padded.split_at_mut(self.lengths[r] * self.dim);
                padding.fill(0.0);
                self.read_sample_into(r, sample)?;
                Ok(then(sample))
            })
            .collect::<Result<Vec<T>>>()?;
        let batch = HostBatch {
            values,
            width,
            dim: self.dim,
            lengths: rows.iter().map(|&r| self.lengths[r]).collect(),
        };
        Ok((batch, results))
    }
}

/// Builds a [`LayerRows`] batch by batch (e.g. the final tokens of a set), in memory or in a
/// temporary file that lives as long as the rows do.
pub struct RowsBuilder {
    rows: LayerRows,
    /// The open temporary file, the same file as rows read back from it, and the next byte to
    /// write, when on disk.
    file: Option<(std::fs::File, Arc<RowFile>, u64)>,
}

impl RowsBuilder {
    pub fn in_memory(tokens: usize, dim: usize) -> Self {
        Self {
            rows: LayerRows {
                lengths: Vec::new(),
                tokens,
                dim,
                storage: Storage::Memory {
                    values: Arc::new(Vec::new()),
                    starts: Vec::new(),
                },
            },
            file: None,
        }
    }

    /// Rows written to a temporary file in `dir` that has no name: no other process (on this
    /// host or another one sharing `dir`) can see or remove it, and the kernel frees it when the
    /// last copy of the rows is dropped or the process dies, however it dies (SIGKILL included).
    pub fn on_disk(dir: &std::path::Path, tokens: usize, dim: usize) -> Result<Self> {
        let file = tempfile::tempfile_in(dir)
            .with_context(|| format!("{}: cannot create a temporary file", dir.display()))?;
        let reader = file
            .try_clone()
            .with_context(|| format!("{}: cannot reopen a temporary file", dir.display()))?;
        let rows_file = RowFile::held(dir.join("(unnamed temporary file)"), reader);
        Ok(Self {
            rows: LayerRows {
                lengths: Vec::new(),
                tokens,
                dim,
                storage: Storage::Disk(Vec::new()),
            },
            file: Some((file, rows_file, 0)),
        })
    }

    /// Appends a batch (B, L, D), keeping each sample's first `lengths[i]` rows.
    pub fn push(&mut self, batch: &Tensor, lengths: &[usize]) -> Result<()> {
        let (b, width, dim) = batch.dims3()?;
        ensure!(
            dim == self.rows.dim && lengths.len() == b && lengths.iter().all(|&l| l <= width),
            "a batch {:?} with lengths {lengths:?} does not fit rows of width {}",
            batch.dims(),
            self.rows.dim
        );
        let values: Vec<f32> = batch.flatten_all()?.to_vec1()?;
        for (i, &len) in lengths.iter().enumerate() {
            let sample = &values[i * width * dim..(i * width + len) * dim];
            match (&mut self.rows.storage, &mut self.file) {
                (Storage::Memory { values, starts }, _) => {
                    let values = Arc::make_mut(values);
                    starts.push(values.len() / dim);
                    values.extend_from_slice(sample);
                }
                (Storage::Disk(samples), Some((file, rows_file, offset))) => {
                    let bytes: Vec<u8> = sample.iter().flat_map(|v| v.to_le_bytes()).collect();
                    file.write_all_at(&bytes, *offset).with_context(|| {
                        format!("{}: cannot write rows", rows_file.path.display())
                    })?;
                    samples.push(OnDisk {
                        file: Arc::clone(rows_file),
                        offset: *offset,
                        digest: rows_digest(sample),
                        verified: Arc::new(AtomicBool::new(false)),
                    });
                    *offset += bytes.len() as u64;
                }
                _ => bail!("rows builder without its storage"),
            }
            self.rows.lengths.push(len);
        }
        Ok(())
    }

    pub fn finish(self) -> LayerRows {
        self.rows
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ragged_rows_come_back_zero_padded_with_their_mask() {
        let values: Vec<f32> = (0..2 * 3 * 2).map(|v| v as f32 + 1.0).collect();
        let padded = Tensor::from_vec(values, (2, 3, 2), &Device::Cpu).unwrap();
        let rows = LayerRows::from_padded(&padded, vec![3, 1]).unwrap();
        let batch = rows.batch(&[1, 0], &Device::Cpu).unwrap();
        assert_eq!(batch.inputs.dims(), [2, 3, 2]);
        let got: Vec<Vec<Vec<f32>>> = batch.inputs.to_vec3().unwrap();
        assert_eq!(got[0], vec![vec![7., 8.], vec![0., 0.], vec![0., 0.]]);
        assert_eq!(got[1][2], vec![5., 6.]);
        assert_eq!(
            batch.mask().unwrap().to_vec2::<u32>().unwrap(),
            vec![vec![1, 0, 0], vec![1, 1, 1]]
        );
        let short = rows.batch(&[1], &Device::Cpu).unwrap();
        assert_eq!(short.inputs.dims(), [1, 1, 2]);
        assert!(rows.batch(&[2], &Device::Cpu).is_err());
    }

    /// A batch written into an earlier batch's buffer, longer or shorter and full of other
    /// values, is the fresh batch: every value read or set to the padding's 0.
    #[test]
    fn a_reused_buffer_leaves_nothing_of_the_earlier_batch() {
        let values: Vec<f32> = (0..2 * 3 * 2).map(|v| v as f32 + 1.0).collect();
        let padded = Tensor::from_vec(values, (2, 3, 2), &Device::Cpu).unwrap();
        let rows = LayerRows::from_padded(&padded, vec![3, 1]).unwrap();
        let fresh = rows.host_batch(&[1, 0]).unwrap();
        for buffer in [vec![f32::NAN; 40], vec![f32::NAN; 5], Vec::new()] {
            let (reused, firsts) = rows
                .host_batch_then(&[1, 0], buffer, |sample| sample[0])
                .unwrap();
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&reused.values), bits(&fresh.values));
            assert_eq!(reused.values[2..6], [0.0; 4]);
            assert_eq!(firsts, [7.0, 1.0]);
        }
    }

    /// Rows spilled to `dir`: two samples of 3 × 2 values.
    fn spilled(dir: &std::path::Path) -> (LayerRows, Vec<Vec<Vec<f32>>>) {
        let values: Vec<f32> = (0..2 * 3 * 2).map(|v| v as f32 * 0.25).collect();
        let padded = Tensor::from_vec(values, (2, 3, 2), &Device::Cpu).unwrap();
        let mut builder = RowsBuilder::on_disk(dir, 3, 2).unwrap();
        builder.push(&padded, &[3, 3]).unwrap();
        (builder.finish(), padded.to_vec3().unwrap())
    }

    /// The open temporary file spilled rows live in.
    fn spill_file(rows: &LayerRows) -> std::fs::File {
        let Storage::Disk(samples) = &rows.storage else {
            panic!("rows in memory")
        };
        samples[0].file.file().unwrap().try_clone().unwrap()
    }

    /// The rows of `samples`, read as a batch.
    fn read(rows: &LayerRows, samples: &[usize]) -> Vec<Vec<Vec<f32>>> {
        let batch = rows.batch(samples, &Device::Cpu).unwrap();
        batch.inputs.to_vec3().unwrap()
    }

    /// A sample whose bytes changed before it was first read is refused, naming the file.
    #[test]
    fn rows_that_differ_from_their_digest_are_refused_at_the_first_read() {
        let dir = tempfile::tempdir().unwrap();
        let (rows, _) = spilled(dir.path());
        let file = spill_file(&rows);
        file.write_all_at(&7f32.to_le_bytes(), 0).unwrap();
        let err = match rows.batch(&[0], &Device::Cpu) {
            Ok(_) => panic!("changed rows were read"),
            Err(e) => e.to_string(),
        };
        assert!(err.contains("differ from the digest"), "{err}");
        assert!(rows.batch(&[1], &Device::Cpu).is_ok());
    }

    /// Spilled rows have no name in their folder: a process that removes every file there (a
    /// job on another host or in another PID namespace sweeping a shared cache) cannot take them
    /// from a running job, and a killed job leaves nothing behind.
    #[test]
    fn spilled_rows_survive_anything_done_to_their_folder() {
        let dir = tempfile::tempdir().unwrap();
        let (rows, expected) = spilled(dir.path());
        let names = |dir: &std::path::Path| std::fs::read_dir(dir).unwrap().count();
        assert_eq!(
            names(dir.path()),
            0,
            "spilled rows left a name in their folder"
        );
        std::fs::remove_dir_all(dir.path()).unwrap();
        assert_eq!(
            read(&rows, &[1, 0]),
            vec![expected[1].clone(), expected[0].clone()]
        );
    }

    /// A sample's digest is SHA-256 of its little-endian f32 bytes, however they are fed to the
    /// hasher: caches written with one value per update still verify.
    #[test]
    fn a_rows_digest_is_sha256_of_the_little_endian_bytes() {
        use sha2::Digest;
        for len in [0, 1, 1023, 1024, 1025, 197 * 192 + 3] {
            let values: Vec<f32> = (0..len).map(|v| (v as f32).sin() * 1e3).collect();
            let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
            let whole = sha2::Sha256::digest(&bytes);
            let expected = crate::io::hex(&whole[..8]);
            assert_eq!(rows_digest(&values), expected, "{len} values");
        }
    }

    /// The content digest is the same for the same rows on disk (from the recorded digests) and
    /// in memory (computed), and moves with any value or length.
    #[test]
    fn content_digest_follows_the_rows_wherever_they_are() {
        let values: Vec<f32> = (0..2 * 3 * 2).map(|v| v as f32 * 0.5).collect();
        let padded = Tensor::from_vec(values, (2, 3, 2), &Device::Cpu).unwrap();
        let in_memory = LayerRows::from_padded(&padded, vec![3, 2]).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let mut spilled = RowsBuilder::on_disk(dir.path(), 3, 2).unwrap();
        spilled.push(&padded, &[3, 2]).unwrap();
        let on_disk = spilled.finish();
        assert_eq!(in_memory.content_digest(), on_disk.content_digest());
        let shorter = LayerRows::from_padded(&padded, vec![3, 1]).unwrap();
        assert_ne!(in_memory.content_digest(), shorter.content_digest());
        let changed = LayerRows::from_padded(&(padded + 1e-3).unwrap(), vec![3, 2]).unwrap();
        assert_ne!(in_memory.content_digest(), changed.content_digest());
    }

    /// Rows spread over more shards than the process holds open keep their descriptors bounded
    /// and read the same values when a closed shard is reopened; a shard whose path was replaced
    /// since it was checked is refused, not read.
    #[test]
    fn shards_beyond_the_open_limit_are_reopened_only_as_the_same_file() {
        let dir = tempfile::tempdir().unwrap();
        let shards = MAX_OPEN_ROW_FILES + 8;
        let write = |k: usize, shift: f32| {
            let values: Vec<f32> = (0..4).map(|v| (k * 4 + v) as f32 + shift).collect();
            let path = dir.path().join(format!("shard-{k}.bin"));
            let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
            let temporary = dir.path().join("next.bin");
            std::fs::write(&temporary, bytes).unwrap();
            std::fs::rename(&temporary, &path).unwrap();
            (Arc::new(path), 0u64, 2usize, rows_digest(&values))
        };
        let samples: Vec<_> = (0..shards).map(|k| write(k, 0.0)).collect();
        let rows = LayerRows::on_disk(samples, 2, 2);
        let open_here = || {
            std::fs::read_dir("/proc/self/fd")
                .unwrap()
                .filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
                .filter(|target| target.starts_with(dir.path()))
                .count()
        };
        let all: Vec<usize> = (0..shards).collect();
        let first = read(&rows, &all);
        assert!(open_here() <= MAX_OPEN_ROW_FILES, "{} open", open_here());
        // Shard 0 was closed by the later ones; read again, it is reopened and the same.
        assert_eq!(read(&rows, &all), first);
        assert!(open_here() <= MAX_OPEN_ROW_FILES);
        // Replaced while closed: refused, naming the file.
        write(0, 100.0);
        for k in 1..shards {
            read(&rows, &[k]);
        }
        let Err(err) = rows.batch(&[0], &Device::Cpu) else {
            panic!("a replaced shard was read")
        };
        let err = format!("{err:#}");
        assert!(
            err.contains("shard-0.bin") && err.contains("replaced"),
            "{err}"
        );
    }
}
