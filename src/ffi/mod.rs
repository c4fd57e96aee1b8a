//! Raw C layouts, with no logic. Only this layer has `pub` raw-pointer fields.

pub mod arrow_device;
pub mod dlpack;
pub mod exchange;
