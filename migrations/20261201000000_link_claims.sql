-- The claim of a link: the session generations of its source and its
-- destination when the destination's claim was accepted. A connection does
-- not outlive the sessions it was negotiated under, so a leader compares
-- these with the ends' current sessions to know whether the claim still
-- says anything about what the nodes hold.
--
-- Nullable, so a binary of the release before (which never writes them)
-- keeps working during a rolling upgrade: a NULL claim on a claimed link
-- only means that it is claimed again before it counts as Applied.
ALTER TABLE links
    ADD COLUMN claim_source_generation bigint,
    ADD COLUMN claim_dest_generation   bigint,
    ADD CONSTRAINT links_claim_whole CHECK (
        (claim_source_generation IS NULL) = (claim_dest_generation IS NULL));
