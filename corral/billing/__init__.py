"""Generated protobuf and gRPC code of corral.billing (see protos/)."""
