//! Placeholder until the sqlite backend lands (memory-backed so the mount can be tried).
use crate::backend::memory::MemoryBackend;
use crate::error::FsResult;
pub struct SqliteBackend;
impl SqliteBackend {
    pub fn open(_path: &std::path::Path, _ns: &str) -> FsResult<MemoryBackend> {
        Ok(MemoryBackend::new(None))
    }
}
