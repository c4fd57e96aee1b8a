//! The session options of dlframe's SQL functions, set as DataFusion's own are:
//! `SET dlframe.inexact = 'round'`.

use datafusion::common::config::{ConfigExtension, ConfigOptions, DATAFUSION_FFI_CONFIG_NAMESPACE};
use datafusion::common::{Result, extensions_options, plan_datafusion_err};
use datafusion::prelude::SessionContext;
use dlframe::options::Inexact;

extensions_options! {
    /// dlframe's options of a session (prefix `dlframe.`).
    pub struct DlframeOptions {
        /// What `to_tensor` does with an integer that the float dtype cannot hold exactly
        /// (int64 2^53 + 1 into float64): 'error' (default) or 'round' (as numpy rounds).
        pub inexact: String, default = "error".to_string()
    }
}

impl ConfigExtension for DlframeOptions {
    const PREFIX: &'static str = "dlframe";
}

/// Adds the options to `ctx`'s session, unless they are there already (their values kept).
pub fn add_options(ctx: &SessionContext) {
    let state = ctx.state_ref();
    let mut state = state.write();
    let extensions = &mut state.config_mut().options_mut().extensions;
    if extensions.get::<DlframeOptions>().is_none() {
        extensions.insert(DlframeOptions::default());
    }
}

/// The `inexact` mode of a session: its `dlframe.inexact`, or the default where the options
/// were not added (a host that registers the functions without [`crate::register`]). Options
/// that crossed datafusion-ffi (a datafusion-python session made with dlframe's options) arrive
/// as entries of the FFI namespace, under their own key or under the namespace's.
pub fn inexact(config: &ConfigOptions) -> Result<Inexact> {
    let key = format!("{}.inexact", DlframeOptions::PREFIX);
    let value = match config.extensions.get::<DlframeOptions>() {
        Some(o) => Some(o.inexact.clone()),
        None => config
            .extensions
            .iter()
            .filter(|(prefix, _)| *prefix == DATAFUSION_FFI_CONFIG_NAMESPACE)
            .flat_map(|(_, e)| e.entries())
            .find(|e| {
                let k = e.key.as_str();
                k == key
                    || k.strip_prefix(DATAFUSION_FFI_CONFIG_NAMESPACE).and_then(|k| k.strip_prefix('.'))
                        == Some(&key)
            })
            .and_then(|e| e.value),
    };
    match value {
        Some(v) => Inexact::parse(&v).map_err(|e| plan_datafusion_err!("dlframe.inexact: {e}")),
        None => Ok(Inexact::default()),
    }
}
