-- Registration-auth domains managed through the API (SLIM 3.x `slimctl
-- controller domain add`): a group and the secret its nodes sign their
-- registration tokens with. The secret is sealed (AES-256-GCM under a key
-- the replicas get from their environment, never stored here): verifying
-- an HMAC token needs the secret itself, so a one-way hash would not do,
-- and a plain copy would let anyone who reads the database or a backup
-- register nodes.
CREATE TABLE domains (
    name       text COLLATE "C" PRIMARY KEY,
    sealed     bytea NOT NULL CHECK (length(sealed) > 0),
    updated_at timestamptz NOT NULL DEFAULT now()
);
