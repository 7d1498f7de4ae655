"""Exact analyses of scheduled statements that codegen and the cost model read: data
footprints of tiles, vector lane strides and register-tile inits."""
