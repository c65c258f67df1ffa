package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"github.com/agentenv/agentenv/compose"
	"io"
	"net/http"
	"net/url"
	"strings"

	pb "github.com/agentenv/agentenv/cluster/schedulerpb"
	"github.com/agentenv/agentenv/internal/failpoint"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// fpCreated sits between a node's successful create and its binding: a
// gateway that dies there leaves a sandbox its node's roster binds.
var fpCreated = failpoint.New("gateway/create/created")

// maxBody bounds a create or fork body read to be replayed on another node
// (a compose create's: compose.MaxRequestBytes, as the node's).
const maxBody = 1 << 20

// createBody is the part of a create the gateway reads: the optional
// resources (aenvd extensions; E2B sizes sandboxes by template).
type createBody struct {
	CPUCount *int32 `json:"cpuCount"`
	MemoryMB *int64 `json:"memoryMB"`
	// VolumeMounts name volumes: the create goes to their node.
	VolumeMounts []volumeEntry `json:"volumeMounts"`
}

// created is the part of a create's answer the gateway reads.
type created struct {
	SandboxID string `json:"sandboxID"`
}

func readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	return readBodyLimit(w, r, maxBody)
}

func readBodyLimit(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, bool) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("request body: %v (at most %d bytes)", err, limit))
		return nil, false
	}
	return body, true
}

// create places a create on a node, retries on another when a node refuses
// for capacity (503), and binds the sandbox where it was made.
func (g *Gateway) create(w http.ResponseWriter, r *http.Request) {
	limit := int64(maxBody)
	if r.URL.Path == "/sandboxes-compose" {
		limit = compose.MaxRequestBytes
	}
	body, ok := readBodyLimit(w, r, limit)
	if !ok {
		return
	}
	var cb createBody
	if err := json.Unmarshal(body, &cb); err != nil {
		writeError(w, http.StatusBadRequest, "create body: "+err.Error())
		return
	}
	res := &pb.Resources{}
	if cb.CPUCount != nil {
		res.CpuCount = *cb.CPUCount
	}
	if cb.MemoryMB != nil {
		res.MemoryMb = *cb.MemoryMB
	}
	exclude, ok := g.volumeNodeExclusion(w, r, cb.VolumeMounts)
	if !ok {
		return
	}
	var last *http.Response
	for attempt := 0; attempt < g.opts.MaxCreateAttempts; attempt++ {
		pl, err := g.place(r.Context(), res, exclude, "")
		if err != nil {
			if last != nil { // every node refused: the last refusal says why
				relay(w, last)
				return
			}
			g.failPlace(w, err)
			return
		}
		resp, err := g.send(r, pl.url(), body)
		if err != nil {
			g.log.Warn("create: node unreachable; trying another", "node", pl.name(), "err", err)
			g.unreserve(r.Context(), pl)
			exclude = append(exclude, pl.name())
			continue
		}
		if resp.StatusCode == http.StatusServiceUnavailable {
			g.log.Info("create refused for capacity; trying another node", "node", pl.name())
			g.unreserve(r.Context(), pl)
			if last != nil {
				last.Body.Close()
			}
			last = bufferResponse(resp)
			exclude = append(exclude, pl.name())
			continue
		}
		if last != nil {
			last.Body.Close()
		}
		g.finishCreate(w, r, resp, pl)
		return
	}
	if last != nil {
		relay(w, last)
		return
	}
	writeError(w, http.StatusServiceUnavailable, "no node accepted the create")
}

// placement is where Place put a create: the node, and the reservation it
// holds there until a bind or unreserve gives it back.
type placement struct {
	node        *pb.Node
	reservation string
}

func (p placement) name() string { return p.node.GetStatus().GetName() }
func (p placement) url() string  { return p.node.GetStatus().GetApiUrl() }

// place asks the scheduler for a node; restoreOf names the sandbox whose
// paused state the node must be able to restore ("" for a create).
func (g *Gateway) place(ctx context.Context, res *pb.Resources, exclude []string, restoreOf string) (placement, error) {
	req := &pb.PlaceRequest{Resources: res, Exclude: exclude, RestoreOf: restoreOf}
	p, err := g.sched.Place(ctx, req)
	if status.Code(err) == codes.Unavailable {
		p, err = g.sched.Place(ctx, req)
	}
	if err != nil {
		return placement{}, err
	}
	return placement{node: p.GetNode(), reservation: p.GetReservation()}, nil
}

// unreserve gives back a placement no sandbox took (the node refused or
// could not be reached); a failure only leaves it to expire.
func (g *Gateway) unreserve(ctx context.Context, p placement) {
	if p.reservation == "" {
		return
	}
	_, err := g.sched.Unreserve(context.WithoutCancel(ctx), &pb.UnreserveRequest{Node: p.name(), Reservation: p.reservation})
	if err != nil {
		g.log.Debug("unreserve (it expires by itself)", "node", p.name(), "err", err)
	}
}

func (g *Gateway) failPlace(w http.ResponseWriter, err error) {
	if status.Code(err) == codes.FailedPrecondition { // no live node can restore the snapshot
		writeError(w, http.StatusConflict, status.Convert(err).Message())
		return
	}
	if status.Code(err) == codes.ResourceExhausted {
		w.Header().Set("Retry-After", "5")
		writeError(w, http.StatusServiceUnavailable, "no node can hold the sandbox: "+status.Convert(err).Message())
		return
	}
	g.log.Warn("placement failed", "err", err)
	writeError(w, http.StatusServiceUnavailable, "scheduler unavailable: "+status.Convert(err).Message())
}

// send replays the request with body on the node at base.
func (g *Gateway) send(r *http.Request, base string, body []byte) (*http.Response, error) {
	u, err := url.Parse(base)
	if err != nil {
		return nil, fmt.Errorf("node url %q: %w", base, err)
	}
	u = u.JoinPath(r.URL.Path)
	u.RawQuery = r.URL.RawQuery
	out, err := http.NewRequestWithContext(r.Context(), r.Method, u.String(), bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	out.Header = r.Header.Clone()
	out.Host = r.Host
	return g.tr.RoundTrip(out)
}

// finishCreate binds a created sandbox (before the client hears of it, so
// its next call routes) and relays the node's answer.
func (g *Gateway) finishCreate(w http.ResponseWriter, r *http.Request, resp *http.Response, pl placement) {
	resp = bufferResponse(resp)
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		g.unreserve(r.Context(), pl)
	} else {
		b, _ := io.ReadAll(resp.Body)
		resp.Body = io.NopCloser(bytes.NewReader(b))
		var c created
		if err := json.Unmarshal(b, &c); err != nil || !validID(c.SandboxID) {
			g.unreserve(r.Context(), pl)
			writeError(w, http.StatusBadGateway, "node answered a create without a sandbox id")
			return
		}
		if err := fpCreated.Inject(); err != nil {
			g.log.Warn("create: not bound (fault injected); the node's roster binds it", "sandbox", c.SandboxID)
		} else if err := g.bind(r.Context(), c.SandboxID, pl.node, pl.reservation); err != nil {
			g.log.Error("bind a created sandbox", "sandbox", c.SandboxID, "node", pl.name(), "err", err)
			// The node's roster binds it within a heartbeat; the sandbox exists.
		}
	}
	relay(w, resp)
}

// bind binds id to node, giving back the placement's reservation ("" for
// none).
func (g *Gateway) bind(ctx context.Context, id string, node *pb.Node, reservation string) error {
	req := &pb.BindRequest{SandboxId: id, Node: node.GetStatus().GetName(), Reservation: reservation}
	_, err := g.sched.Bind(context.WithoutCancel(ctx), req)
	if status.Code(err) == codes.Unavailable {
		_, err = g.sched.Bind(context.WithoutCancel(ctx), req)
	}
	if err == nil {
		if u, perr := url.Parse(node.GetStatus().GetApiUrl()); perr == nil {
			g.remember(id, u)
		}
	}
	return err
}

// fork forwards a fork to the parent's node and binds the children there.
func (g *Gateway) fork(w http.ResponseWriter, r *http.Request, u *url.URL, id string) {
	body, ok := readBody(w, r)
	if !ok {
		return
	}
	resp, err := g.send(r, u.String(), body)
	if err != nil {
		writeError(w, http.StatusBadGateway, "node unreachable: "+err.Error())
		return
	}
	resp = bufferResponse(resp)
	defer resp.Body.Close()
	if resp.StatusCode/100 == 2 {
		b, _ := io.ReadAll(resp.Body)
		resp.Body = io.NopCloser(bytes.NewReader(b))
		var results []struct {
			Sandbox *created `json:"sandbox"`
		}
		_ = json.Unmarshal(b, &results) // an answer we cannot read binds nothing; rosters catch up
		look, err := g.lookup(r.Context(), id)
		for _, c := range results {
			if err != nil || c.Sandbox == nil || !validID(c.Sandbox.SandboxID) {
				continue
			}
			if berr := g.bind(r.Context(), c.Sandbox.SandboxID, look.GetNode(), ""); berr != nil {
				g.log.Warn("bind a fork child", "sandbox", c.Sandbox.SandboxID, "err", berr)
			}
		}
	}
	relay(w, resp)
}

// bufferResponse reads a small answer into memory (creates and forks
// answer JSON of a few kB), so it can be inspected and relayed later.
func bufferResponse(resp *http.Response) *http.Response {
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4*maxBody))
	resp.Body.Close()
	if err != nil {
		b = nil
	}
	resp.Body = io.NopCloser(bytes.NewReader(b))
	return resp
}

// relay writes a node's answer to the client.
func relay(w http.ResponseWriter, resp *http.Response) {
	defer resp.Body.Close()
	for k, vs := range resp.Header {
		if strings.EqualFold(k, "Content-Length") || strings.EqualFold(k, "Connection") {
			continue
		}
		for _, v := range vs {
			w.Header().Add(k, v)
		}
	}
	w.WriteHeader(resp.StatusCode)
	_, _ = io.Copy(w, resp.Body)
}
