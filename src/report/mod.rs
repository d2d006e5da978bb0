//! Everything a run leaves for a reader: JSON/CSV tables, PNG figures and TensorBoard events.

pub mod attention_maps;
pub mod data;
pub mod delay;
pub mod dose;
pub mod finetune;
pub mod kept;
pub mod paper;
pub mod plot;
pub mod reproduce;
pub mod results;
pub mod snr_plant;
pub mod synthetic;
pub mod tensorboard;
pub mod theory;
pub mod verdict;
