//! The object machinery shared by the API server and its clients-to-be: the `Status`
//! errors the API answers with, label and field selectors, the name and label
//! validation rules of k8s.io/apimachinery, with upstream's messages, and the Kubernetes
//! protobuf encoding of the built-in types.

pub mod protobuf;
pub mod selector;
pub mod status;
pub mod validation;
