//! Frozen pretrained backbones (ViT for images, BERT for text): where their files are (`hub`),
//! the preprocessing that makes their inputs identical to Hugging Face's (`preprocess`, `text`),
//! the encoders (`layers`, `vit`, `bert`), the unified `backbone`, and the feature `cache` that runs
//! each input through a backbone once.

pub mod backbone;
pub mod bert;
pub mod cache;
pub mod hub;
pub mod layer_rows;
pub mod layers;
pub mod preprocess;
pub mod projections;
pub mod text;
pub mod timm;
pub mod vit;
pub use backbone::{Backbone, Encoded, Model, TextOptions};
pub use hub::{BackboneFiles, resolve};

mod config_json;
