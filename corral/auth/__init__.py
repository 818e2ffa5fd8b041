"""Generated protobuf and gRPC code of corral.auth (see protos/)."""
