package firecracker

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	fcclient "github.com/firecracker-microvm/firecracker-go-sdk/client"
	"github.com/firecracker-microvm/firecracker-go-sdk/client/models"
	ops "github.com/firecracker-microvm/firecracker-go-sdk/client/operations"
	"github.com/go-openapi/runtime"
	httptransport "github.com/go-openapi/runtime/client"
	"github.com/go-openapi/strfmt"
)

// apiTimeout bounds one API call: Firecracker answers in milliseconds, except
// snapshot creation, which writes the whole memory image.
const (
	apiTimeout      = 10 * time.Second
	snapshotTimeout = 5 * time.Minute
)

// APIError is a non-success answer of the Firecracker API. Fault carries
// Firecracker's own explanation (its fault_message).
type APIError struct {
	Op    string // "PUT /drives/rootfs"
	Code  int    // HTTP status, 0 when unknown
	Fault string
}

func (e *APIError) Error() string {
	if e.Code != 0 {
		return fmt.Sprintf("firecracker %s: HTTP %d: %s", e.Op, e.Code, e.Fault)
	}
	return fmt.Sprintf("firecracker %s: %s", e.Op, e.Fault)
}

// client is a thin layer over the SDK's generated operations: it binds the
// Unix socket, applies per-call deadlines and turns the generated error types
// into APIError.
type client struct {
	ops       *ops.Client
	transport runtime.ClientTransport
}

func newClient(socket string) *client {
	dialer := &net.Dialer{Timeout: 2 * time.Second}
	hc := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return dialer.DialContext(ctx, "unix", socket)
		},
		// One VMM serves one client; a single idle connection is enough.
		MaxIdleConns:    1,
		IdleConnTimeout: 30 * time.Second,
	}}
	tr := httptransport.NewWithClient(fcclient.DefaultHost, fcclient.DefaultBasePath, fcclient.DefaultSchemes, hc)
	return &client{ops: ops.New(tr, strfmt.Default), transport: tr}
}

// wrap names the operation in err and extracts Firecracker's fault message
// from the generated response types, which all carry a *models.Error.
func wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	var payload interface{ GetPayload() *models.Error }
	if errors.As(err, &payload) {
		ae := &APIError{Op: op, Fault: "no fault message"}
		if p := payload.GetPayload(); p != nil && p.FaultMessage != "" {
			ae.Fault = p.FaultMessage
		}
		var coded interface{ Code() int }
		if errors.As(err, &coded) {
			ae.Code = coded.Code()
		} else {
			ae.Code = statusFromMessage(err.Error())
		}
		return ae
	}
	var apiErr *runtime.APIError
	if errors.As(err, &apiErr) {
		return &APIError{Op: op, Code: apiErr.Code, Fault: "unexpected response"}
	}
	return fmt.Errorf("firecracker %s: %w", op, err)
}

// statusFromMessage reads the status of a generated response type that has
// no Code method (400, 404 ...): their messages read "[PUT /path][400] ...".
func statusFromMessage(msg string) int {
	_, rest, ok := strings.Cut(msg, "][")
	if !ok {
		return 0
	}
	code, _, _ := strings.Cut(rest, "]")
	n, err := strconv.Atoi(code)
	if err != nil {
		return 0
	}
	return n
}

func (c *client) putLogger(ctx context.Context, l *models.Logger) error {
	p := ops.NewPutLoggerParamsWithContext(ctx).WithTimeout(apiTimeout).WithBody(l)
	_, err := c.ops.PutLogger(p)
	return wrap("PUT /logger", err)
}

func (c *client) putMetrics(ctx context.Context, m *models.Metrics) error {
	p := ops.NewPutMetricsParamsWithContext(ctx).WithTimeout(apiTimeout).WithBody(m)
	_, err := c.ops.PutMetrics(p)
	return wrap("PUT /metrics", err)
}

func (c *client) putMachineConfig(ctx context.Context, mc *models.MachineConfiguration) error {
	p := ops.NewPutMachineConfigurationParamsWithContext(ctx).WithTimeout(apiTimeout).WithBody(mc)
	_, err := c.ops.PutMachineConfiguration(p)
	return wrap("PUT /machine-config", err)
}

func (c *client) putBootSource(ctx context.Context, bs *models.BootSource) error {
	p := ops.NewPutGuestBootSourceParamsWithContext(ctx).WithTimeout(apiTimeout).WithBody(bs)
	_, err := c.ops.PutGuestBootSource(p)
	return wrap("PUT /boot-source", err)
}

func (c *client) putDrive(ctx context.Context, d *models.Drive) error {
	p := ops.NewPutGuestDriveByIDParamsWithContext(ctx).WithTimeout(apiTimeout).WithDriveID(*d.DriveID).WithBody(d)
	_, err := c.ops.PutGuestDriveByID(p)
	return wrap("PUT /drives/"+*d.DriveID, err)
}

func (c *client) patchDrive(ctx context.Context, id, path string) error {
	body := &models.PartialDrive{DriveID: &id, PathOnHost: path}
	p := ops.NewPatchGuestDriveByIDParamsWithContext(ctx).WithTimeout(apiTimeout).WithDriveID(id).WithBody(body)
	_, err := c.ops.PatchGuestDriveByID(p)
	return wrap("PATCH /drives/"+id, err)
}

func (c *client) putNIC(ctx context.Context, n *models.NetworkInterface) error {
	p := ops.NewPutGuestNetworkInterfaceByIDParamsWithContext(ctx).WithTimeout(apiTimeout).WithIfaceID(*n.IfaceID).WithBody(n)
	_, err := c.ops.PutGuestNetworkInterfaceByID(p)
	return wrap("PUT /network-interfaces/"+*n.IfaceID, err)
}

func (c *client) putBalloon(ctx context.Context, b *models.Balloon) error {
	p := ops.NewPutBalloonParamsWithContext(ctx).WithTimeout(apiTimeout).WithBody(b)
	_, err := c.ops.PutBalloon(p)
	return wrap("PUT /balloon", err)
}

func (c *client) patchBalloon(ctx context.Context, amountMiB int64) error {
	p := ops.NewPatchBalloonParamsWithContext(ctx).WithTimeout(apiTimeout).WithBody(&models.BalloonUpdate{AmountMib: &amountMiB})
	_, err := c.ops.PatchBalloon(p)
	return wrap("PATCH /balloon", err)
}

func (c *client) balloonStats(ctx context.Context) (*models.BalloonStats, error) {
	p := ops.NewDescribeBalloonStatsParamsWithContext(ctx).WithTimeout(apiTimeout)
	res, err := c.ops.DescribeBalloonStats(p)
	if err != nil {
		return nil, wrap("GET /balloon/statistics", err)
	}
	return res.Payload, nil
}

func (c *client) putMMDSConfig(ctx context.Context, mc *models.MmdsConfig) error {
	p := ops.NewPutMmdsConfigParamsWithContext(ctx).WithTimeout(apiTimeout).WithBody(mc)
	_, err := c.ops.PutMmdsConfig(p)
	return wrap("PUT /mmds/config", err)
}

func (c *client) putMMDS(ctx context.Context, data any) error {
	p := ops.NewPutMmdsParamsWithContext(ctx).WithTimeout(apiTimeout).WithBody(data)
	_, err := c.ops.PutMmds(p)
	return wrap("PUT /mmds", err)
}

func (c *client) patchMMDS(ctx context.Context, data any) error {
	p := ops.NewPatchMmdsParamsWithContext(ctx).WithTimeout(apiTimeout).WithBody(data)
	_, err := c.ops.PatchMmds(p)
	return wrap("PATCH /mmds", err)
}

func (c *client) getMMDS(ctx context.Context) (any, error) {
	p := ops.NewGetMmdsParamsWithContext(ctx).WithTimeout(apiTimeout)
	res, err := c.ops.GetMmds(p)
	if err != nil {
		return nil, wrap("GET /mmds", err)
	}
	return res.Payload, nil
}

func (c *client) action(ctx context.Context, kind string) error {
	p := ops.NewCreateSyncActionParamsWithContext(ctx).WithTimeout(apiTimeout).WithInfo(&models.InstanceActionInfo{ActionType: &kind})
	_, err := c.ops.CreateSyncAction(p)
	return wrap("PUT /actions "+kind, err)
}

func (c *client) patchVM(ctx context.Context, state string) error {
	p := ops.NewPatchVMParamsWithContext(ctx).WithTimeout(apiTimeout).WithBody(&models.VM{State: &state})
	_, err := c.ops.PatchVM(p)
	return wrap("PATCH /vm "+state, err)
}

func (c *client) describe(ctx context.Context) (*models.InstanceInfo, error) {
	p := ops.NewDescribeInstanceParamsWithContext(ctx).WithTimeout(apiTimeout)
	res, err := c.ops.DescribeInstance(p)
	if err != nil {
		return nil, wrap("GET /", err)
	}
	return res.Payload, nil
}

func (c *client) createSnapshot(ctx context.Context, sp *models.SnapshotCreateParams) error {
	p := ops.NewCreateSnapshotParamsWithContext(ctx).WithTimeout(snapshotTimeout).WithBody(sp)
	_, err := c.ops.CreateSnapshot(p)
	return wrap("PUT /snapshot/create", err)
}

// networkOverride and loadParams extend the SDK's model (API 1.4.1) with
// network_overrides, which later Firecracker releases accept to swap the tap
// of a restored interface. It is only sent when a tap actually changes, so
// older releases, which reject unknown fields, keep working otherwise.
type networkOverride struct {
	IfaceID     string `json:"iface_id"`
	HostDevName string `json:"host_dev_name"`
}

type loadParams struct {
	*models.SnapshotLoadParams
	NetworkOverrides []networkOverride `json:"network_overrides,omitempty"`
}

func (c *client) loadSnapshot(ctx context.Context, lp loadParams) error {
	const op = "PUT /snapshot/load"
	if len(lp.NetworkOverrides) == 0 {
		p := ops.NewLoadSnapshotParamsWithContext(ctx).WithTimeout(snapshotTimeout).WithBody(lp.SnapshotLoadParams)
		_, err := c.ops.LoadSnapshot(p)
		return wrap(op, err)
	}
	// The generated operation only takes the 1.4.1 body: submit the same
	// operation through the same transport with the extended body.
	_, err := c.transport.Submit(&runtime.ClientOperation{
		ID:                 "loadSnapshot",
		Method:             http.MethodPut,
		PathPattern:        "/snapshot/load",
		ProducesMediaTypes: []string{"application/json"},
		ConsumesMediaTypes: []string{"application/json"},
		Schemes:            []string{"http"},
		Context:            ctx,
		Params: runtime.ClientRequestWriterFunc(func(r runtime.ClientRequest, _ strfmt.Registry) error {
			if err := r.SetTimeout(snapshotTimeout); err != nil {
				return err
			}
			return r.SetBodyParam(lp)
		}),
		Reader: runtime.ClientResponseReaderFunc(func(resp runtime.ClientResponse, cons runtime.Consumer) (any, error) {
			if resp.Code() == http.StatusNoContent {
				return nil, nil
			}
			var fault models.Error
			_ = cons.Consume(resp.Body(), &fault)
			msg := fault.FaultMessage
			if msg == "" {
				msg = "no fault message"
			}
			return nil, &APIError{Op: op, Code: resp.Code(), Fault: msg}
		}),
	})
	var ae *APIError
	if errors.As(err, &ae) {
		return err
	}
	return wrap(op, err)
}
