//! Values that a query builds outside DataFusion's memory pool, bounded before they are built.
//!
//! DataFusion accounts the memory of its sorts, joins and aggregations, but not what a scalar
//! function returns: `repeat('x', 1000000000)`, `array_repeat(1, 1000000000)` or
//! `array_resize(make_array(1), 1e9, 0)` would allocate gigabytes that no pool is asked for, and
//! an allocation the machine cannot give stops the process. So every function a query calls on
//! `dlframe serve` is wrapped in [`Bounded`], with the rule that `functions.rs` gives it:
//! - before the call, its result's size is worked out from its arguments by the rule
//!   (`growth.rs`: the lengths, counts and sizes it was given, without building anything);
//! - a call past the query's memory limit fails with "Resources exhausted", as a query over its
//!   memory limit does, and so does a call that the query's pool cannot grant;
//! - the result is charged to the query's pool for as long as it lives: its buffers hold the
//!   pool's reservation, so the query's limit covers all its function results together.
//!
//! [`Rules::bound`] makes sure of the wrapping wherever a function enters a plan: by name from
//! SQL or Substrait, from DataFusion's planners (`[1, 2]`, `s['a']`), or from another function's
//! simplification; and it turns the text operator `||`, which DataFusion does not count either,
//! into a bounded function too.

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::ptr::NonNull;
use std::sync::Arc;

use arrow_array::{Array, RecordBatch, make_array};
use arrow_schema::{DataType, Field, FieldRef, Schema};
use datafusion::arrow::array::ArrayData;
use datafusion::arrow::buffer::{BooleanBuffer, Buffer, NullBuffer};
use datafusion::common::config::{ConfigEntry, ConfigExtension, ExtensionOptions};
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{DataFusionError, Result};
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryPool, MemoryReservation};
use datafusion::logical_expr::expr::ScalarFunction;
use datafusion::logical_expr::type_coercion::binary::BinaryTypeCoercer;
use datafusion::logical_expr::{
    BinaryExpr, ColumnarValue, Expr, Operator, ReturnFieldArgs, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl,
    Signature, Volatility,
};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::{BinaryExpr as PhysicalBinary, Column};

use super::growth::{Call, Growth};

/// The rule of every function a query may call, and the limit of one query's memory.
#[derive(Debug)]
pub(crate) struct Rules {
    growth: HashMap<String, Growth>,
    limit: usize,
}

impl Rules {
    pub(crate) fn new(growth: impl IntoIterator<Item = (&'static str, Growth)>, limit: usize) -> Arc<Rules> {
        Arc::new(Rules { growth: growth.into_iter().map(|(n, g)| (n.to_string(), g)).collect(), limit })
    }

    /// `udf` bounded by its rule; None for a function without one (not exposed).
    pub(crate) fn wrap(self: &Arc<Self>, udf: Arc<ScalarUDF>) -> Option<ScalarUDF> {
        let growth = *self.growth.get(udf.name())?;
        Some(ScalarUDF::new_from_impl(Bounded { inner: udf, growth, rules: Arc::clone(self) }))
    }

    /// `expr` with every function call bounded and `||` on text made a bounded call; an error
    /// names a function that is not exposed.
    pub(crate) fn bound(self: &Arc<Self>, expr: Expr) -> Result<Transformed<Expr>> {
        expr.transform_up(|e| match e {
            Expr::ScalarFunction(f) if !(f.func.inner().as_ref() as &dyn std::any::Any).is::<Bounded>() => {
                let name = f.func.name().to_string();
                let wrapped = self.wrap(Arc::clone(&f.func)).ok_or_else(|| {
                    DataFusionError::Plan(format!("the function {name}() is not available on this server"))
                })?;
                Ok(Transformed::yes(Expr::ScalarFunction(ScalarFunction::new_udf(Arc::new(wrapped), f.args))))
            }
            Expr::BinaryExpr(BinaryExpr { left, op: Operator::StringConcat, right }) => {
                let concat = ScalarUDF::new_from_impl(Bounded {
                    inner: Arc::new(ScalarUDF::new_from_impl(Concatenate::default())),
                    growth: Growth::Scaled(2),
                    rules: Arc::clone(self),
                });
                Ok(Transformed::yes(Expr::ScalarFunction(ScalarFunction::new_udf(
                    Arc::new(concat),
                    vec![*left, *right],
                ))))
            }
            e => Ok(Transformed::no(e)),
        })
    }
}

/// The memory pool of the query that runs, carried in its session's options so that the
/// functions it calls can charge it. A session without one (the server's own, which plans but
/// never runs) holds calls to the limit alone.
#[derive(Debug, Clone)]
pub(crate) struct QueryMemory(pub Arc<dyn MemoryPool>);

impl ConfigExtension for QueryMemory {
    const PREFIX: &'static str = "dlframe_query_memory";
}

impl ExtensionOptions for QueryMemory {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn std::any::Any {
        self
    }

    fn cloned(&self) -> Box<dyn ExtensionOptions> {
        Box::new(self.clone())
    }

    fn set(&mut self, key: &str, _value: &str) -> Result<()> {
        Err(DataFusionError::Plan(format!("{key} cannot be set")))
    }

    fn entries(&self) -> Vec<ConfigEntry> {
        Vec::new()
    }
}

/// A function whose result is bounded before it is built, and charged to the query's pool
/// while it lives.
pub(crate) struct Bounded {
    inner: Arc<ScalarUDF>,
    growth: Growth,
    rules: Arc<Rules>,
}

/// Only the function and its rule: DataFusion writes a plan's functions into some of its errors
/// in debug form, and the rules of every exposed function would fill the client's message.
impl std::fmt::Debug for Bounded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Bounded({}, {:?})", self.inner.name(), self.growth)
    }
}

impl PartialEq for Bounded {
    fn eq(&self, other: &Self) -> bool {
        self.inner == other.inner && self.growth == other.growth && self.rules.limit == other.rules.limit
    }
}

impl Eq for Bounded {}

impl std::hash::Hash for Bounded {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        (&self.inner, self.growth, self.rules.limit).hash(state);
    }
}

impl Bounded {
    /// The bytes the call's result would take, at most. A call on constants builds one value,
    /// which its rows then copy.
    fn result_bytes(&self, args: &ScalarFunctionArgs) -> Result<u64> {
        let all_scalar = args.args.iter().all(|a| matches!(a, ColumnarValue::Scalar(_)));
        if all_scalar {
            let one = self.growth.bytes(&Call { args: &args.args, rows: 1 })?;
            Ok(one.saturating_mul(args.number_rows.max(1) as u64))
        } else {
            self.growth.bytes(&Call { args: &args.args, rows: args.number_rows })
        }
    }

    fn exhausted(&self, what: String) -> DataFusionError {
        DataFusionError::ResourcesExhausted(format!(
            "{}() {what}, over the query's memory limit of {} MB (--query-memory)",
            self.name(),
            self.rules.limit >> 20
        ))
    }
}

impl ScalarUDFImpl for Bounded {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn aliases(&self) -> &[String] {
        self.inner.aliases()
    }

    fn schema_name(&self, args: &[Expr]) -> Result<String> {
        self.inner.schema_name(args)
    }

    fn signature(&self) -> &Signature {
        self.inner.signature()
    }

    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        self.inner.return_type(arg_types)
    }

    fn with_updated_config(&self, config: &datafusion::common::config::ConfigOptions) -> Option<ScalarUDF> {
        let updated = self.inner.inner().with_updated_config(config)?;
        Some(ScalarUDF::new_from_impl(Bounded {
            inner: Arc::new(updated),
            growth: self.growth,
            rules: self.rules.clone(),
        }))
    }

    fn return_field_from_args(&self, args: ReturnFieldArgs) -> Result<FieldRef> {
        self.inner.return_field_from_args(args)
    }

    fn is_strict(&self) -> bool {
        self.inner.is_strict()
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let bytes = self.result_bytes(&args)?;
        if bytes > self.rules.limit as u64 {
            return Err(self.exhausted(format!("would build {bytes} bytes")));
        }
        let pool = args.config_options.extensions.get::<QueryMemory>().map(|m| m.0.clone());
        let Some(pool) = pool else { return self.inner.invoke_with_args(args) };
        let charge = MemoryConsumer::new(self.name().to_string()).register(&pool);
        charge.try_grow(bytes as usize).map_err(|e| {
            self.exhausted(format!("would build {bytes} bytes, and the query's pool refused: {e}"))
        })?;
        match self.inner.invoke_with_args(args)? {
            ColumnarValue::Array(a) => {
                let data = a.to_data();
                charge.resize(data.get_slice_memory_size().unwrap_or_else(|_| a.get_array_memory_size()));
                Ok(ColumnarValue::Array(make_array(held(data, &Arc::new(Held(AssertUnwindSafe(charge)))))))
            }
            // A constant result is copied onto the rows by the plan, which counted them above.
            scalar => Ok(scalar),
        }
    }

    fn simplify(
        &self,
        args: Vec<Expr>,
        info: &datafusion::logical_expr::simplify::SimplifyContext,
    ) -> Result<datafusion::logical_expr::simplify::ExprSimplifyResult> {
        use datafusion::logical_expr::simplify::ExprSimplifyResult;
        // A simplified call may name DataFusion's own functions again: bound them too.
        Ok(match self.inner.simplify(args, info)? {
            ExprSimplifyResult::Simplified(e) => ExprSimplifyResult::Simplified(self.rules.bound(e)?.data),
            original => original,
        })
    }

    fn short_circuits(&self) -> bool {
        self.inner.short_circuits()
    }

    fn conditional_arguments<'a>(&self, args: &'a [Expr]) -> Option<(Vec<&'a Expr>, Vec<&'a Expr>)> {
        self.inner.conditional_arguments(args)
    }

    fn evaluate_bounds(
        &self,
        input: &[&datafusion::logical_expr::interval_arithmetic::Interval],
    ) -> Result<datafusion::logical_expr::interval_arithmetic::Interval> {
        self.inner.evaluate_bounds(input)
    }

    fn propagate_constraints(
        &self,
        interval: &datafusion::logical_expr::interval_arithmetic::Interval,
        inputs: &[&datafusion::logical_expr::interval_arithmetic::Interval],
    ) -> Result<Option<Vec<datafusion::logical_expr::interval_arithmetic::Interval>>> {
        self.inner.propagate_constraints(interval, inputs)
    }

    fn output_ordering(
        &self,
        inputs: &[datafusion::logical_expr::sort_properties::ExprProperties],
    ) -> Result<datafusion::logical_expr::sort_properties::SortProperties> {
        self.inner.output_ordering(inputs)
    }

    fn preserves_lex_ordering(
        &self,
        inputs: &[datafusion::logical_expr::sort_properties::ExprProperties],
    ) -> Result<bool> {
        self.inner.preserves_lex_ordering(inputs)
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> Result<Vec<DataType>> {
        self.inner.coerce_types(arg_types)
    }

    fn documentation(&self) -> Option<&datafusion::logical_expr::Documentation> {
        self.inner.documentation()
    }
}

/// The reservation that a function's result holds, released when its last buffer goes.
#[expect(dead_code, reason = "held for its drop, which gives the bytes back to the pool")]
struct Held(AssertUnwindSafe<MemoryReservation>);

/// `data` with every buffer holding `charge` as well as its own memory. Copies and checks
/// nothing.
fn held(data: ArrayData, charge: &Arc<Held>) -> ArrayData {
    let hold = |b: &Buffer| -> Buffer {
        let owner = Arc::new(AssertUnwindSafe((b.clone(), charge.clone())));
        let ptr = NonNull::new(b.as_ptr() as *mut u8).unwrap_or(NonNull::dangling());
        // SAFETY: `ptr` points at `b.len()` bytes of `b`, which `owner` keeps alive and
        // unchanged for as long as the new buffer lives (a Buffer's bytes are immutable).
        unsafe { Buffer::from_custom_allocation(ptr, b.len(), owner) }
    };
    let buffers: Vec<Buffer> = data.buffers().iter().map(hold).collect();
    let children = data.child_data().iter().map(|c| held(c.clone(), charge)).collect();
    let nulls = data.nulls().map(|n| {
        let bits = BooleanBuffer::new(hold(n.buffer()), n.offset(), n.len());
        // SAFETY: the same bits as `n`, so the same count of nulls.
        unsafe { NullBuffer::new_unchecked(bits, n.null_count()) }
    });
    let builder = data.into_builder().buffers(buffers).child_data(children).nulls(nulls);
    // SAFETY: the function built `data` valid, and every buffer is replaced by one over the same
    // bytes at the same address, so offsets, UTF-8 and lengths are as valid as they were;
    // validating them again would read every value of every call's result.
    unsafe { builder.build_unchecked() }
}

/// `a || b` on text as a function, so that its result is bounded and charged as a function's
/// is; DataFusion's own operator does the work.
#[derive(Debug, PartialEq, Eq, Hash)]
struct Concatenate {
    signature: Signature,
}

impl Default for Concatenate {
    fn default() -> Self {
        Concatenate { signature: Signature::any(2, Volatility::Immutable) }
    }
}

impl ScalarUDFImpl for Concatenate {
    fn name(&self) -> &str {
        "||"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        let [l, r] = arg_types else { return Err(DataFusionError::Plan("|| takes two arguments".into())) };
        BinaryTypeCoercer::new(l, &Operator::StringConcat, r).get_result_type()
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let rows = args.number_rows;
        let columns = args.args.iter().map(|a| a.to_array(rows)).collect::<Result<Vec<_>>>()?;
        let fields: Vec<Field> = columns
            .iter()
            .enumerate()
            .map(|(i, c)| Field::new(format!("{i}"), c.data_type().clone(), true))
            .collect();
        let batch = RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)?;
        let op = PhysicalBinary::new(
            Arc::new(Column::new("0", 0)),
            Operator::StringConcat,
            Arc::new(Column::new("1", 1)),
        );
        op.evaluate(&batch)
    }
}
