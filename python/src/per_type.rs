//! A small cache of what was learnt about a Python type (its DLPack exchange table, whether it is
//! a pyarrow primitive array), looked up by the type object's address: the check behind it runs
//! once per type, not once per call.

use std::sync::Mutex;

use pyo3::prelude::*;
use pyo3::types::PyType;

/// The most types kept; past it the cache starts again. Most programs see a handful of types.
const MAX_TYPES: usize = 64;

/// Types seen, each with what `learn` found. The types are held (a strong reference), so an
/// address is never reused by another type while it is in the cache.
pub struct PerType<T: Copy>(Mutex<Vec<(Py<PyType>, T)>>);

impl<T: Copy> PerType<T> {
    pub const fn new() -> Self {
        PerType(Mutex::new(Vec::new()))
    }

    /// What `learn` says of `ty`, from the cache or learnt now. `learn` runs outside the lock:
    /// it may run Python code (a metaclass) that comes back here. Its errors are not cached.
    pub fn get<E>(
        &self,
        ty: &Bound<'_, PyType>,
        learn: impl FnOnce(&Bound<'_, PyType>) -> Result<T, E>,
    ) -> Result<T, E> {
        let cached = self
            .0
            .lock()
            .ok()
            .and_then(|t| t.iter().find(|(k, _)| k.as_ptr() == ty.as_ptr()).map(|(_, v)| *v));
        if let Some(found) = cached {
            return Ok(found);
        }
        let found = learn(ty)?;
        if let Ok(mut types) = self.0.lock() {
            if types.len() >= MAX_TYPES {
                types.clear();
            }
            types.push((ty.clone().unbind(), found));
        }
        Ok(found)
    }
}
