-- The southbound revision of a node's latest registration (2 for SLIM
-- 2.0.0-alpha.2 or a 3.x node that sent no 3.x field, 3 for the 3.x
-- line): what the control plane sends the node is written for it. Rows
-- registered before this column read as 2, the only revision slim-cp
-- told apart then. A binary of the release before leaves the column as
-- it was when it records a registration; it never reads it.
ALTER TABLE nodes
    ADD COLUMN revision smallint NOT NULL DEFAULT 2 CHECK (revision IN (2, 3));
