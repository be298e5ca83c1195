-- Room on pages for a row's next version. The hot writes after a
-- registration change no indexed column: a link's claim and status, a
-- route's status, a node's claim facts and session state. With free space
-- on the row's page such an update is HOT (heap-only): no index gets a new
-- entry. On full pages (the default fillfactor of 100) every one of them
-- wrote an entry into each index of its table; a claim's link update
-- cost about five times as much. Only pages written from now on leave the
-- room; setting it takes no lock that blocks reads or writes. Links and
-- routes get half a page: an acknowledgement rewrites all of a node's
-- routes at once, and at 70 % fewer than half of those updates found room
-- on their page.
ALTER TABLE links SET (fillfactor = 50);
ALTER TABLE routes SET (fillfactor = 50);
ALTER TABLE nodes SET (fillfactor = 70);
