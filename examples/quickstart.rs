//! The main job until the CLI lands: Arrow columns -> DLPack -> Arrow, zero-copy, printed.
//!
//! `cargo run --example quickstart`

use std::sync::Arc;

use arrow_array::{Array, ArrayRef, FixedSizeListArray, Float32Array, TimestampMicrosecondArray};
use arrow_schema::Field;
use dlframe::arrow::{array_to_tensor, tensor_to_column};
use dlframe::{ForeignTensor, export_versioned};

fn show(name: &str, column: ArrayRef) -> dlframe::Result<()> {
    let tensor = array_to_tensor(column.as_ref())?;
    let src = tensor.data_ptr();
    let exported = export_versioned(tensor);
    let flags = exported.flags();
    // SAFETY: a fresh export, imported exactly once, as a DLPack consumer would.
    let imported = unsafe { ForeignTensor::from_versioned(exported.into_raw()) }?.into_tensor();
    let same = imported.data_ptr() == src;
    let (field, back) = tensor_to_column(&imported, name)?;
    println!(
        "{name:<10} {:<28} -> tensor {:<6} shape {:?} strides {:?} flags {flags:#b} -> {:<28} zero-copy: {same}",
        column.data_type().to_string(),
        imported.dtype().to_string(),
        imported.shape(),
        imported.strides(),
        field.data_type().to_string(),
    );
    assert_eq!(back.to_data(), column.to_data());
    Ok(())
}

fn main() -> dlframe::Result<()> {
    let price: ArrayRef = Arc::new(Float32Array::from_iter_values((0..1_000_000).map(|i| i as f32 * 0.25)));
    let ts: ArrayRef = Arc::new(TimestampMicrosecondArray::from_iter_values(0..1_000).with_timezone("UTC"));
    let item = Arc::new(Field::new("item", arrow_schema::DataType::Float32, true));
    let embedding: ArrayRef = Arc::new(FixedSizeListArray::new(item, 4, price.slice(0, 4_000), None));
    show("price", price.slice(10, 100))?;
    show("ts", ts)?;
    show("embedding", embedding)?;
    match array_to_tensor(&arrow_array::StringArray::from(vec!["a"])) {
        Err(e) => println!("strings    -> error: {e}"),
        Ok(_) => unreachable!("strings have no tensor form"),
    }
    Ok(())
}
