"""The hostile battery: tfm-export and tfm-run used the way a hostile or unlucky user would (`make hostile`)."""
