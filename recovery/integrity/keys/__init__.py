"""Keys and signatures: ``signing`` (DSSE bundles in the OpenSSF model-signing format,
the trust store), ``trust`` (which signer and which keys a run or a command uses),
``devkeys`` (the dev key's search order and this machine's registry) and ``seal`` (the
journal's steering events signed and chained).
"""
