//! One module per io_uring operation.

mod accept;
mod connect;
mod poll;

pub use accept::accept;
pub use connect::connect;
pub use poll::{poll, Interest};
