// Package simulate replays arrivals of jobs and slots on a virtual clock through the code that
// decides in production, to show what a configuration would have done with traffic that came
// (`sluice simulate`): admission's checks (gate.Decider: the rate limit's reservations, depth
// caps, queue=false) on the admission rate limit's windows and grants (admitrate.Local), the
// claim's choice (drainer.Chooser: ordering, weights, caps, tiers, lanes, reserve) in each
// tenant's queue order (store.Head.Before: interactive, priority with aging, age), and a slot's
// grant (gate.DecideSlot). Nothing here restates a rule: the Engine keeps the queues, the clock
// and the figures, and asks those functions.
//
// The job arrivals of one instant are decided together, as one admission transaction decides
// its items, and a claim pass follows Options.ArrivalPickup after them, or OutcomePickup after an
// outcome (Calibrate measures both on the audit trail's window). Not modelled: executor refusals
// and gates on rate keys, start deadlines, max_queue_age, replace keys, cancellations and
// retries; fair_time orders by the executor time the simulation itself has charged (decayed as
// store.TimeUsed decays it).
package simulate

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/sluicehq/sluice/gate/job"
)

// Kind is what an Arrival is.
type Kind string

// The kinds of arrival.
const (
	// Job is an admission request (POST /v1/jobs).
	Job Kind = "job"
	// Slot is a slot request (POST /v1/slots): granted, it holds a unit for Service, or until
	// the SlotEnd of its ID when Service is 0.
	Slot Kind = "slot"
	// SlotEnd is the release of the slot that arrived with ID.
	SlotEnd Kind = "slot_end"
)

// Arrival is one request as it came, with what the simulation cannot decide: how long the
// executor took.
type Arrival struct {
	At          time.Time
	Kind        Kind
	ID          string // a slot's id (Slot, SlotEnd); optional otherwise
	Tenant      string
	Lanes       []string // sorted
	Interactive bool
	Priority    int  // 0-9
	Immediate   bool // queue=false: start now or be refused
	Aware       bool // the client handles a capacity refusal (Sluice-Capacity-Aware)
	RunAt       time.Time
	// Service is, for a job, the time from its claim to its outcome; for a slot, how long it is
	// held (0: until its SlotEnd).
	Service time.Duration
}

// Source gives arrivals in time order; Next returns io.EOF after the last.
type Source interface {
	Next() (Arrival, error)
}

// Slice is a Source over arrivals already in time order.
type Slice []Arrival

// Next returns the first arrival left.
func (s *Slice) Next() (Arrival, error) {
	if len(*s) == 0 {
		return Arrival{}, io.EOF
	}
	a := (*s)[0]
	*s = (*s)[1:]
	return a, nil
}

// line is one line of an arrivals file (the README's "sluice simulate" gives the format).
type line struct {
	At          json.RawMessage `json:"at"`
	Kind        Kind            `json:"kind"`
	ID          string          `json:"id"`
	Tenant      string          `json:"tenant"`
	Lanes       []string        `json:"lanes"`
	Interactive bool            `json:"interactive"`
	Priority    *int            `json:"priority"`
	Queue       *bool           `json:"queue"`
	Aware       bool            `json:"aware"`
	RunAt       *time.Time      `json:"run_at"`
	ServiceMS   *float64        `json:"service_ms"`
	HoldMS      *float64        `json:"hold_ms"`
}

// Lines reads arrivals, one JSON object per line, from r: `at` is an RFC 3339 time or a number of
// seconds from start. Blank lines are skipped; an error names the line and the field.
func Lines(r io.Reader, start time.Time) Source {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	return &lines{sc: sc, start: start}
}

type lines struct {
	sc    *bufio.Scanner
	start time.Time
	n     int
	last  time.Time
	open  map[string]int // the line of each slot held until its slot_end
}

func (l *lines) Next() (Arrival, error) {
	for l.sc.Scan() {
		l.n++
		text := strings.TrimSpace(l.sc.Text())
		if text == "" {
			continue
		}
		a, err := l.parse([]byte(text))
		if err == nil {
			err = l.pair(a)
		}
		if err != nil {
			return Arrival{}, fmt.Errorf("arrivals line %d: %w", l.n, err)
		}
		if a.At.Before(l.last) {
			return Arrival{}, fmt.Errorf("arrivals line %d: at %s is before the line above (%s): arrivals must be in time order",
				l.n, a.At.Format(time.RFC3339Nano), l.last.Format(time.RFC3339Nano))
		}
		l.last = a.At
		return a, nil
	}
	if err := l.sc.Err(); err != nil {
		return Arrival{}, fmt.Errorf("arrivals line %d: %w", l.n+1, err)
	}
	return Arrival{}, io.EOF
}

// pair checks that a slot held until its slot_end is not opened twice, and that a slot_end ends
// a slot so held.
func (l *lines) pair(a Arrival) error {
	if l.open == nil {
		l.open = map[string]int{}
	}
	switch {
	case a.Kind == Slot && a.ID != "" && a.Service == 0:
		if at, ok := l.open[a.ID]; ok {
			return fmt.Errorf("id: slot %q is already held (line %d) and not ended", a.ID, at)
		}
		l.open[a.ID] = l.n
	case a.Kind == SlotEnd:
		if _, ok := l.open[a.ID]; !ok {
			return fmt.Errorf("id: no slot %q is held until a slot_end (a slot line with this id and no hold_ms)", a.ID)
		}
		delete(l.open, a.ID)
	}
	return nil
}

func (l *lines) parse(b []byte) (Arrival, error) {
	var ln line
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&ln); err != nil {
		return Arrival{}, fmt.Errorf("not a JSON object of the arrivals format: %w", err)
	}
	a := Arrival{Kind: ln.Kind, ID: ln.ID, Tenant: ln.Tenant, Lanes: ln.Lanes, Interactive: ln.Interactive,
		Priority: job.DefaultPriority, Aware: ln.Aware}
	if a.Kind == "" {
		a.Kind = Job
	}
	var err error
	if a.At, err = l.at(ln.At); err != nil {
		return Arrival{}, err
	}
	switch a.Kind {
	case Job, Slot:
		if a.Tenant == "" {
			return Arrival{}, errors.New("tenant: required")
		}
	case SlotEnd:
		if a.ID == "" {
			return Arrival{}, errors.New("id: required for a slot_end")
		}
		return a, nil
	default:
		return Arrival{}, fmt.Errorf("kind: want job, slot or slot_end, got %q", a.Kind)
	}
	if a.Kind == Slot && ln.HoldMS == nil && a.ID == "" {
		return Arrival{}, errors.New("hold_ms: required for a slot without an id (its slot_end names the id)")
	}
	if ln.Priority != nil {
		if *ln.Priority < job.MinPriority || *ln.Priority > job.MaxPriority {
			return Arrival{}, fmt.Errorf("priority: want %d to %d, got %d", job.MinPriority, job.MaxPriority, *ln.Priority)
		}
		a.Priority = *ln.Priority
	}
	a.Immediate = ln.Queue != nil && !*ln.Queue
	if ln.RunAt != nil {
		a.RunAt = ln.RunAt.UTC()
	}
	ms := ln.ServiceMS
	if a.Kind == Slot {
		ms = ln.HoldMS
	} else if ms == nil {
		return Arrival{}, errors.New("service_ms: required for a job (the time from its claim to its outcome)")
	}
	if ms != nil {
		if *ms < 0 {
			return Arrival{}, fmt.Errorf("%s: want milliseconds ≥ 0, got %g", map[Kind]string{Job: "service_ms", Slot: "hold_ms"}[a.Kind], *ms)
		}
		a.Service = time.Duration(*ms * float64(time.Millisecond))
	}
	for _, l := range a.Lanes {
		if l == "" {
			return Arrival{}, errors.New("lanes: a lane's name is empty")
		}
	}
	a.Lanes = slices.Compact(slices.Sorted(slices.Values(a.Lanes)))
	return a, nil
}

func (l *lines) at(raw json.RawMessage) (time.Time, error) {
	if len(raw) == 0 {
		return time.Time{}, errors.New("at: required (an RFC 3339 time or seconds from the start)")
	}
	var secs float64
	if err := json.Unmarshal(raw, &secs); err == nil {
		if secs < 0 {
			return time.Time{}, fmt.Errorf("at: want seconds ≥ 0, got %g", secs)
		}
		return l.start.Add(time.Duration(secs * float64(time.Second))), nil
	}
	var t time.Time
	if err := json.Unmarshal(raw, &t); err != nil {
		return time.Time{}, fmt.Errorf("at: want an RFC 3339 time or seconds from the start, got %s", raw)
	}
	return t.UTC(), nil
}
