-- The initial schema. Every text column that is compared or ordered uses the
-- "C" collation: the store's contract orders by byte value (as Rust's `Ord`
-- for strings does), never by a locale's rules.

-- Store-wide session generations: increasing across every node and across a
-- node record's deletion and re-creation.
CREATE SEQUENCE generation_seq AS bigint;
-- Creation order of templates: the oldest template roots a name's tree.
CREATE SEQUENCE template_seq AS bigint;

CREATE TABLE nodes (
    id                   text COLLATE "C" PRIMARY KEY,
    group_name           text COLLATE "C",
    connection_details   jsonb NOT NULL DEFAULT '[]',
    reported_connections jsonb NOT NULL DEFAULT '[]',
    reported_routes      jsonb NOT NULL DEFAULT '[]',
    received_links       jsonb NOT NULL DEFAULT '[]',
    -- The current session; all NULL while the node is disconnected.
    session_id           uuid,
    session_generation   bigint,
    session_owner        text COLLATE "C",
    session_incarnation  bigint,
    session_state        text CHECK (session_state IN ('registering', 'ready')),
    -- Generation of the latest session ever started for this record.
    generation           bigint NOT NULL DEFAULT 0,
    departure_generation bigint,
    departure_kind       text CHECK (departure_kind IN ('crash', 'deregistered')),
    updated_at           timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT nodes_session_whole CHECK (
        (session_id IS NULL) = (session_generation IS NULL)
        AND (session_id IS NULL) = (session_owner IS NULL)
        AND (session_id IS NULL) = (session_incarnation IS NULL)
        AND (session_id IS NULL) = (session_state IS NULL)),
    CONSTRAINT nodes_departure_whole CHECK (
        (departure_generation IS NULL) = (departure_kind IS NULL))
);
-- A replica's sessions, for the crash path when its heartbeat expires.
CREATE INDEX nodes_session_owner ON nodes (session_owner) WHERE session_id IS NOT NULL;

-- Announced names (`* -> node`). No foreign key to nodes: forgetting a node
-- leaves its templates for the leader to drop by generation.
CREATE TABLE templates (
    seq        bigint PRIMARY KEY,
    node       text COLLATE "C" NOT NULL,
    component0 text NOT NULL,
    component1 text NOT NULL,
    component2 text NOT NULL,
    -- The optional 128-bit component id in decimal; NULL is NULL_COMPONENT.
    name_id    text CHECK (name_id ~ '^[0-9]{1,39}$'),
    generation bigint NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
);
CREATE UNIQUE INDEX templates_node_name
    ON templates (node, component0, component1, component2, (coalesce(name_id, '')));

CREATE TABLE links (
    link_id       text COLLATE "C" PRIMARY KEY,
    source_node   text COLLATE "C" NOT NULL,
    source_group  text COLLATE "C" NOT NULL,
    dest_group    text COLLATE "C" NOT NULL,
    dest_node     text COLLATE "C",
    dest_endpoint text NOT NULL,
    config_data   text NOT NULL,
    status        text NOT NULL CHECK (status IN ('pending', 'connecting', 'applied', 'failed')),
    status_msg    text NOT NULL DEFAULT '',
    deleted       boolean NOT NULL DEFAULT false,
    updated_at    timestamptz NOT NULL DEFAULT now()
);
-- The invariant the whole design leans on: one live link per unordered
-- group pair. Writers put tombstones and deletes before new live links.
CREATE UNIQUE INDEX links_one_live_per_pair
    ON links (least(source_group, dest_group), greatest(source_group, dest_group))
    WHERE NOT deleted;
CREATE INDEX links_source_node ON links (source_node);
CREATE INDEX links_dest_node ON links (dest_node) WHERE dest_node IS NOT NULL;

CREATE TABLE routes (
    id          text COLLATE "C" PRIMARY KEY,
    source_node text COLLATE "C" NOT NULL,
    dest_node   text COLLATE "C" NOT NULL,
    link_id     text COLLATE "C" NOT NULL,
    component0  text NOT NULL,
    component1  text NOT NULL,
    component2  text NOT NULL,
    name_id     text CHECK (name_id ~ '^[0-9]{1,39}$'),
    status      text NOT NULL CHECK (status IN ('pending', 'applied', 'failed', 'deleted')),
    status_msg  text NOT NULL DEFAULT '',
    updated_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX routes_source_node ON routes (source_node);

-- API-mode topology segments and the group pairs that may link in them.
CREATE TABLE segments (
    name text COLLATE "C" PRIMARY KEY
);
CREATE TABLE segment_edges (
    segment text COLLATE "C" NOT NULL REFERENCES segments (name) ON DELETE CASCADE,
    a       text COLLATE "C" NOT NULL,
    b       text COLLATE "C" NOT NULL,
    -- Undirected edges in canonical order (`a = b` is a self-edge).
    CHECK (a <= b),
    PRIMARY KEY (segment, a, b)
);

-- For the HA work: replica liveness and the leadership lease.
CREATE TABLE replicas (
    id                text COLLATE "C" PRIMARY KEY,
    incarnation       bigint NOT NULL,
    internal_endpoint text NOT NULL,
    heartbeat_at      timestamptz NOT NULL DEFAULT now(),
    drain             boolean NOT NULL DEFAULT false
);

-- Exactly one row. Leader transactions read it FOR SHARE and abort unless
-- their epoch stands; a takeover bumps the epoch.
CREATE TABLE leadership (
    singleton  boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    epoch      bigint NOT NULL DEFAULT 0,
    leader     text,
    renewed_at timestamptz
);
INSERT INTO leadership (singleton, epoch) VALUES (true, 0);
