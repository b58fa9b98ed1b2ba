//! The request-path functions `crate::fuzzing` drives, gathered in one place so the modules that
//! define them stay private to the API server.

pub(crate) use super::content::content_range_piece as piece;
pub(crate) use super::handlers::{
    check_object, decode_body, list_options, new_object, replacement, UpdateScope, WriteRequest,
};
pub(crate) use super::patch::{parse as parse_patch, patched_object, PatchKind};
pub(crate) use super::range;
pub(crate) use super::selectors::{FieldSelector, LabelSelector};
pub(crate) use crate::strategy::{ResourceDef, RESOURCES};
