// Package drainer moves queued jobs to the executor: it reacts to pokes, polls once a second as
// the backstop, claims eligible jobs under the global and per-tenant caps, dispatches them,
// records their outcomes (fenced on the claimed version), renews leases, recovers the jobs of
// drainers that died and deletes the slots whose lease ran out. One pass of all of that is
// RunOnce; Run only schedules passes. Live slots (SPEC §5a) count against the caps with the jobs
// in flight in every claim (store.LockClaims), except those granted past a limit, which never
// count (migration 0020): a caller looping slot grants cannot take what the queue needs.
//
// The Drainer is a scheduler of small services, each with its own state and a RunOnce of its
// own that tests may drive without goroutines: the claimer (the claim*.go files, below), the
// dispatcher (dispatch.go) and its completer (complete.go), the lease keeper (leases.go), the
// rescuer (rescue.go), the expirer (expire.go) and the heartbeat (heartbeat.go). What they share
// is in configview.go (the runtime config last read) and claim_headcache.go (the queue heads read
// but not claimed). Observer (observer.go) is the one test signal.
//
// # The claim
//
// The claimer's files all begin with claim:
//
//	claim.go             the claimer and its RunOnce: one claim, from its reads to the jobs it
//	                     hands the dispatcher (claimCandidates, choose), the read it leaves the
//	                     next pass (reuse) and the queue heads it sets forward (advanceHeads)
//	claim_tenants.go     the pages of tenants with work (passState, nextTenants)
//	claim_candidates.go  each tenant's first eligible queued jobs and their gates (candidates)
//	claim_headcache.go   the queue heads read but not claimed (headCache)
//	claim_choice.go      the choice's state (chooser), and Chooser, the choice for simulate
//	claim_pick.go        the tenant whose head job goes next (picker, pick)
//	claim_tx.go          the claim transaction: lock and count, the UPDATE and its commit, the
//	                     hand-back of a stopping drainer and of a claim whose COMMIT lost its
//	                     connection (handBackUnconfirmed)
//	claim_probe.go       the lone-job probe (probeAndClaim)
//	claim_outcomes.go    the outcomes a pass brings, written beside its claim (outcomesBeside)
//
// A claim reads, before its transaction, the in-flight counts and a page of tenants with work,
// their queue heads and the gates of their rate keys; then, in two round trips, it takes the
// claim lock (reading the caps), counts what is in flight, chooses, claims with an UPDATE fenced
// on each job's id, version and queued state, and commits (claimer.RunOnce); the outcomes a pass
// brings are written beside it, on a second connection, and commit first. Four shortcuts
// skip parts of that. None skips the lock or the fence: a shortcut only decides which jobs a
// claim tries, and every claim checks each job against the caps and the counts read under the
// lock in its own transaction, so no claim puts more in flight than the caps allow. The tests
// named are in drainer/ unless marked (integration) or (gate/store).
//
//	shortcut              what it skips                 why the caps stay exact           test that pins it
//	--------------------  ----------------------------  --------------------------------  -----------------------------------
//	lone-job probe        the in-flight counts and      it claims only a lone job that    TestLoneJobClaim,
//	(claim_probe.go:      tenants page (passState),     may start now with no rate key    TestPokedLoneClaimRoundTrips,
//	probeAndClaim),       the heads read and the gate   to look up, after the same check  TestIdleDrainerRoundTrips;
//	while the last pass   lookup: it reads at most two  against the caps and counts read  TestLockClaims,
//	left the queue empty  queued jobs, after a Poke in  under the claim lock, and by the  TestProbeQueue (gate/store)
//	(claimer.probe)       the claim lock's round trip   same fenced UPDATE, as every
//	                                                    claim; anything else is left to
//	                                                    the full pass
//
//	carried read: the     passState's read (the         the carried counts (the claim's   TestChooseCapacity (the carried
//	counts and tenants    in-flight counts, the first   own, plus what it claimed, less   usage counts every job chosen),
//	page a claim leaves   tenants page) for a pass      the outcomes brought) only shape  TestOutcomesBesideTheNextClaim (peak
//	the next pass         that brings the last claim's  the candidates: the claim counts  in flight within the cap);
//	(claim.go:            outcomes, with no poke since  again under the claim lock and    TestDrainerFairness (a poke means a
//	claimer.nextRead,     and a page under pageReuse    checks each job against that      fresh read: a newcomer goes next)
//	reuse)                old that held every tenant    count                             (integration)
//	                      with work
//
//	head cache            the heads read (a subquery    cached heads are only             TestHeadCache,
//	(claim_headcache.go:  per tenant) of a tenant       candidates: the caps are checked  TestHeadCacheKeepsRequeuedJobFirst,
//	headCache)            whose cached heads outnumber  under the claim lock and the      TestClaimSkipsJobTakenMeanwhile,
//	                      its share of the pass, a      fenced UPDATE skips a head        TestHeadCacheKeepsAShortQueue
//	                      short queue's included        claimed or canceled elsewhere
//	                                                    (its tenant's entry goes); later
//	                                                    admissions queue behind the
//	                                                    cached heads, a requeue drops
//	                                                    its tenant and the upkeep drops
//	                                                    all, so the order holds too
//
//	outcomes beside a     the outcomes' own round       their jobs are locked, on a       TestOutcomeHandoff,
//	claim (complete.go:   trip after the claim's: the   second connection, beside the     TestOutcomesBesideTheNextClaim,
//	outcomeHandoff;       next claim's transaction      claim lock's count (store.        TestClaimRollsBackWhenOutcomes-
//	claim_outcomes.go,    waits for them instead, and   LockJobs), so nothing else moves  BesideFail,
//	claim.go:             the server writes both at     them; only the outcomes of jobs   TestOutcomeOfAMovedJobBeside-
//	claimCandidates)      once                          still as claimed are taken out    AClaim; TestOpenClaim
//	                                                    of that count, and the claim      (gate/store)
//	                                                    commits only after them, else
//	                                                    rolls back; a batch with a
//	                                                    requeue is written first, with
//	                                                    no claim
package drainer
