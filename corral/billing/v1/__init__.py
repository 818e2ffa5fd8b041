"""Generated protobuf and gRPC code of corral.billing.v1 (see protos/)."""
