"""Generated protobuf and gRPC code of corral.authz (see protos/)."""
