"""Generated protobuf and gRPC code of corral.authz.v1 (see protos/)."""
