"""Generated protobuf and gRPC code of corral.auth.v1 (see protos/)."""
