"""The broker: data path adapters around the pure cores."""
