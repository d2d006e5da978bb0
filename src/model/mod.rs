//! What phase 2 trains on top of the frozen backbone: the last layer's query/key (the paper) or a
//! token-selection head (the card), and the phase-1 classifier both read out through.

pub mod attend;
pub mod classifier;
pub mod last_layer;
mod token_products;
pub mod token_selection;

pub use classifier::Classifier;
pub use last_layer::{LastLayer, QueryKey};
pub use token_selection::TokenSelectionHead;
