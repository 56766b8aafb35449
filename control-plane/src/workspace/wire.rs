//! `fs/*` wire types, shaped like DAIV's client schemas (`Fs*Request`/`Fs*Response`). They are
//! defined once, in the `sandbox-protocol` crate, because the helper answers with them: the API
//! serves the helper's answers as they are. Every response carries `error` (null on success).

pub use sandbox_protocol::wire::*;
