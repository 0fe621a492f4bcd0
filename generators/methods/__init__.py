"""The methods: `registry` names each one; a module per method builds the parts it puts into the one attention
module (`generators.attention.positional_attention`, through `generators.methods.install.MethodParts`)."""
