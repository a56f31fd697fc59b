"""Pricing catalogue and the cost model: $/Mtok per pricing tier, utilisation, energy, TCO.

Prices live in one file, ``bench/data/prices.yaml`` (DESIGN.md: one source of truth per
fact). A user file of the same schema adds or overrides tiers and ``GPU:tier=price`` strings
from the command line override single prices. GPU hardware facts (TDP) are never typed here:
they come from the hardware catalogue, ``bench.hardware``.

The one formula (DESIGN.md, InferenceX's cost_per_Mtok)::

    $/Mtok = (price per GPU-hour x GPUs) / (tokens per second x 3600) x 1e6

A price is per wall-clock GPU-hour; a fleet that is busy a fraction ``u`` of the time pays
for its idle hours too, so its $/Mtok is the busy-time figure divided by ``u``.
"""

from __future__ import annotations

import datetime as _dt
import math
import numbers
import re
from collections.abc import Iterable, Sequence
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    model_validator,
)

HOURS_PER_YEAR = 8760.0
SECONDS_PER_HOUR = 3600.0
JOULES_PER_KWH = 3.6e6

TierKind = Literal["on_demand", "reserved", "spot", "published_tco", "owned", "custom"]


class PriceCatalogueError(ValueError):
    """A pricing file, a --price override or a cost input is wrong; the message says where."""


# --------------------------------------------------------------------------- models


class _Strict(BaseModel):
    """Unknown keys are errors: a typo in a price file must not be silently ignored."""

    model_config = ConfigDict(extra="forbid")


class Assumption(_Strict):
    """One number of a TCO model, with where it comes from or a note that it is assumed."""

    value: float
    source: str | None = None
    note: str | None = None

    @model_validator(mode="after")
    def _needs_provenance(self) -> Assumption:
        if not (self.source or self.note):
            raise ValueError("give a 'source' or a 'note' saying the value is an assumption")
        if not math.isfinite(self.value) or self.value < 0:
            raise ValueError(f"value must be a finite number >= 0, got {self.value}")
        return self


class TcoAssumptions(_Strict):
    """Owned-hardware assumptions shared by all GPUs unless a tier sets its own."""

    life_years: Assumption | None = None
    pue: Assumption | None = None
    usd_per_kwh: Assumption | None = None
    hosting_usd_per_gpu_hr: Assumption | None = None
    operations_usd_per_gpu_hr: Assumption | None = None
    power_w: Assumption | None = None  # None: the GPU profile's TDP

    @model_validator(mode="after")
    def _ranges(self) -> TcoAssumptions:
        if self.life_years is not None and self.life_years.value <= 0:
            raise ValueError(f"life_years must be > 0, got {self.life_years.value}")
        if self.pue is not None and self.pue.value < 1:
            raise ValueError(f"pue must be >= 1, got {self.pue.value}")
        return self


class Tco(TcoAssumptions):
    """An owned tier: purchase price plus any assumption overriding ``tco_defaults``."""

    capex_usd_per_gpu: Assumption


class Derived(_Strict):
    """A price written as a multiple of another tier of the same GPU (e.g. 37.5% off)."""

    from_tier: str
    factor: float = Field(gt=0)


class Tier(_Strict):
    """One way of paying for one GPU. Exactly one of price / derived / tco sets its price."""

    gpu: str = ""  # filled in by the catalogue from the mapping key
    name: str = ""  # filled in by the catalogue from the mapping key
    kind: TierKind
    provider: str = "user"
    price_usd_per_gpu_hr: float | None = Field(default=None, gt=0)
    derived: Derived | None = None
    tco: Tco | None = None
    low: float | None = Field(default=None, ge=0)
    high: float | None = Field(default=None, ge=0)
    term_years: float | None = Field(default=None, gt=0)
    source: str
    date: str = Field(pattern=r"^\d{4}-\d{2}(-\d{2})?$")
    note: str | None = None
    # The catalogue this tier was loaded into: where a derived tier finds its base tier and an
    # owned tier its tco_defaults, so price_per_gpu_hour(tier) needs nothing else.
    _catalogue: Catalogue | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _one_price(self) -> Tier:
        given = [
            k for k in ("price_usd_per_gpu_hr", "derived", "tco") if getattr(self, k) is not None
        ]
        if len(given) != 1:
            raise ValueError(
                "give exactly one of price_usd_per_gpu_hr, derived or tco"
                + (f" (got {', '.join(given)})" if given else "")
            )
        if (self.kind == "owned") != (self.tco is not None):
            raise ValueError("kind 'owned' goes with a 'tco' block, and only it")
        return self


class Catalogue(_Strict):
    """All tiers of all GPUs, after user files and overrides have been applied."""

    schema_version: int = 1
    tco_defaults: TcoAssumptions = TcoAssumptions()
    gpus: dict[str, dict[str, Tier]]

    def gpu_names(self) -> list[str]:
        return list(self.gpus)

    def resolve_gpu(self, name: str) -> str:
        """The catalogue's name for ``name``: exact, profile alias ("b200"), or case-insensitive."""
        if name in self.gpus:
            return name
        canonical = _profile_name(name)
        if canonical is not None and canonical in self.gpus:
            return canonical
        folded = {k.casefold(): k for k in self.gpus}
        for candidate in (name, f"{name}-SXM"):
            if candidate.casefold() in folded:
                return folded[candidate.casefold()]
        raise PriceCatalogueError(
            f"no prices for GPU {name!r}; the catalogue has {', '.join(self.gpus)}"
        )

    def tiers(self, gpu: str | None = None) -> list[Tier]:
        """Tiers of one GPU (any alias), or of every GPU when ``gpu`` is None."""
        names = [self.resolve_gpu(gpu)] if gpu is not None else list(self.gpus)
        return [tier for g in names for tier in self.gpus[g].values()]

    def tier(self, gpu: str, name: str) -> Tier:
        g = self.resolve_gpu(gpu)
        try:
            return self.gpus[g][name]
        except KeyError:
            raise PriceCatalogueError(
                f"GPU {g} has no tier {name!r}; it has {', '.join(self.gpus[g])}"
            ) from None


# --------------------------------------------------------------------------- loading

SHIPPED_PRICES = "prices.yaml"
_OVERRIDE_RE = re.compile(
    r"^\s*(?P<gpu>[^:=\s]+)\s*:\s*(?P<tier>[^:=\s]+)\s*=\s*(?P<price>\S+)\s*$"
)
_PRICE_FIELDS = ("price_usd_per_gpu_hr", "derived", "tco")


def load_catalogue(extra: Path | None = None, overrides: Sequence[str] = ()) -> Catalogue:
    """The shipped catalogue, then ``extra`` (a user file, same schema), then CLI overrides.

    A tier in ``extra`` that already exists is merged field by field (so ``{price_usd_per_gpu_hr:
    3.1}`` is enough to re-price a shipped tier; giving one of price/derived/tco drops the
    other two); a new tier must be complete. ``overrides`` are ``GPU:tier=price`` strings.
    Errors name the file, the field and the value.
    """
    shipped_text = resources.files("bench.data").joinpath(SHIPPED_PRICES).read_text("utf-8")
    raw = _parse_yaml(shipped_text, "bench/data/prices.yaml")
    catalogue = _validate(raw, "bench/data/prices.yaml")  # the shipped file must stand alone
    label = "bench/data/prices.yaml"
    if extra is not None:
        extra = Path(extra)
        try:
            text = extra.read_text("utf-8")
        except OSError as exc:
            raise PriceCatalogueError(f"{extra}: cannot read prices file: {exc}") from None
        user = _parse_yaml(text, str(extra))
        raw = _merge(raw, user, str(extra), catalogue)
        label = f"{extra} (merged over bench/data/prices.yaml)"
        catalogue = _validate(raw, label)
    if overrides:
        raw = _apply_overrides(raw, overrides, catalogue)
        catalogue = _validate(raw, f"{label} with --price overrides")
    return catalogue


def _parse_yaml(text: str, label: str) -> dict[str, Any]:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise PriceCatalogueError(f"{label}: not valid YAML: {exc}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise PriceCatalogueError(
            f"{label}: expected a mapping at the top, got {type(data).__name__}"
        )
    gpus = data.get("gpus", {})
    if gpus is None:
        gpus = {}
    if not isinstance(gpus, dict) or not all(isinstance(t, dict) for t in gpus.values()):
        raise PriceCatalogueError(
            f"{label}: field 'gpus' must map GPU name -> tier name -> tier, got {gpus!r}"
        )
    data["gpus"] = gpus
    return data


def _merge(
    base: dict[str, Any], user: dict[str, Any], label: str, catalogue: Catalogue
) -> dict[str, Any]:
    """Lay the user's file over the shipped one (tiers field-wise, tco_defaults per field)."""
    unknown = set(user) - {"schema_version", "tco_defaults", "gpus"}
    if unknown:
        raise PriceCatalogueError(
            f"{label}: unknown top-level field(s) {', '.join(sorted(unknown))}; "
            "expected schema_version, tco_defaults, gpus"
        )
    out = {**base, "gpus": {g: dict(t) for g, t in base["gpus"].items()}}
    defaults = user.get("tco_defaults") or {}
    if not isinstance(defaults, dict):
        raise PriceCatalogueError(f"{label}: field 'tco_defaults' must be a mapping")
    out["tco_defaults"] = {**(base.get("tco_defaults") or {}), **defaults}
    for gpu_key, tiers in user["gpus"].items():
        gpu = _resolve_or_new(str(gpu_key), catalogue)
        merged = out["gpus"].setdefault(gpu, {})
        for tier_name, fields in tiers.items():
            if not isinstance(fields, dict):
                raise PriceCatalogueError(
                    f"{label}: field 'gpus.{gpu_key}.{tier_name}' must be a mapping, got {fields!r}"
                )
            old = merged.get(tier_name)
            if old is None:
                merged[tier_name] = dict(fields)
            else:
                merged[tier_name] = _overlay_tier(old, fields)
    return out


def _overlay_tier(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """Field-wise merge; a new way of pricing (price/derived/tco) replaces the old one."""
    out = dict(old)
    if any(k in new for k in _PRICE_FIELDS):
        for k in _PRICE_FIELDS:
            out.pop(k, None)
    out.update(new)
    return out


def _resolve_or_new(name: str, catalogue: Catalogue) -> str:
    try:
        return catalogue.resolve_gpu(name)
    except PriceCatalogueError:
        return name  # a user file may price a GPU we do not ship


def _apply_overrides(
    raw: dict[str, Any], overrides: Iterable[str], catalogue: Catalogue
) -> dict[str, Any]:
    out = {**raw, "gpus": {g: dict(t) for g, t in raw["gpus"].items()}}
    today = _dt.date.today().isoformat()
    for text in overrides:
        m = _OVERRIDE_RE.match(text)
        if not m:
            raise PriceCatalogueError(
                f"--price {text!r}: expected GPU:tier=price_per_gpu_hour, e.g. B200-SXM:my-deal=3.10"
            )
        try:
            price = float(m["price"])
        except ValueError:
            price = math.nan
        if not math.isfinite(price) or price <= 0:
            raise PriceCatalogueError(
                f"--price {text!r}: price {m['price']!r} must be a positive number of $/GPU-hour"
            )
        try:
            gpu = catalogue.resolve_gpu(m["gpu"])
        except PriceCatalogueError as exc:
            raise PriceCatalogueError(
                f"--price {text!r}: {exc}; add new GPUs with --prices-file"
            ) from None
        tiers = out["gpus"][gpu]
        name = m["tier"]
        change = {
            "price_usd_per_gpu_hr": price,
            "source": f"command line --price {text.strip()}",
            "date": today,
        }
        if name in tiers:
            updated = _overlay_tier(tiers[name], change)
            if updated.get("kind") == "owned":  # a flat price is no longer a TCO model
                updated["kind"] = "custom"
            updated.pop("low", None)
            updated.pop("high", None)
            tiers[name] = updated
        else:
            tiers[name] = {"kind": "custom", "provider": "user", **change}
    return out


def _validate(raw: dict[str, Any], label: str) -> Catalogue:
    """Build the Catalogue; fill in names, check derived references, name the bad field."""
    try:
        catalogue = Catalogue.model_validate(raw)
    except ValidationError as exc:
        raise PriceCatalogueError(_describe(exc, label)) from None
    for gpu, tiers in catalogue.gpus.items():
        for name, tier in tiers.items():
            tier.gpu, tier.name = gpu, name
            tier._catalogue = catalogue
    for gpu, tiers in catalogue.gpus.items():
        for name, tier in tiers.items():
            if tier.derived is None:
                continue
            base = tiers.get(tier.derived.from_tier)
            where = f"{label}: field 'gpus.{gpu}.{name}.derived.from_tier'"
            if base is None:
                raise PriceCatalogueError(
                    f"{where}: no tier {tier.derived.from_tier!r} for {gpu} "
                    f"(it has {', '.join(tiers)})"
                )
            if base.derived is not None:
                raise PriceCatalogueError(
                    f"{where}: {tier.derived.from_tier!r} is itself derived; "
                    "derive from a tier with its own price"
                )
    return catalogue


def _describe(exc: ValidationError, label: str) -> str:
    lines = [f"{label}: invalid pricing catalogue"]
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"])
        value = err.get("input")
        if err["type"] == "missing":
            lines.append(f"  field '{loc}': missing (required)")
        else:
            msg = err["msg"].removeprefix("Value error, ")
            lines.append(f"  field '{loc}': {msg} (value: {value!r})")
    return "\n".join(lines)


# --------------------------------------------------------------------------- hardware


def _profile_name(name: str) -> str | None:
    """Canonical GPU name from the hardware catalogue (bench.hardware), or None if unknown or not importable."""
    try:
        from bench.hardware import get_gpu
    except ImportError:
        return None
    try:
        return str(get_gpu(name).name)
    except Exception:  # unknown alias: the profile module's own error type
        return None


def gpu_tdp_w(gpu: str) -> float:
    """The GPU profile's TDP in watts: the default power assumption, never typed in cost code."""
    try:
        from bench.hardware import get_gpu
    except ImportError as exc:
        raise PriceCatalogueError(
            f"cannot read the TDP of {gpu}: bench.hardware is not importable ({exc})"
        ) from None
    try:
        return float(get_gpu(gpu).tdp_w)
    except Exception as exc:
        raise PriceCatalogueError(f"cannot read the TDP of {gpu} from its profile: {exc}") from None


# --------------------------------------------------------------------------- prices


class TcoBreakdown(BaseModel):
    """Owned-hardware $/GPU-hour, term by term, so a deck can show where the money goes."""

    amortisation_usd_per_gpu_hr: float
    power_usd_per_gpu_hr: float
    hosting_usd_per_gpu_hr: float
    operations_usd_per_gpu_hr: float
    total_usd_per_gpu_hr: float
    capex_usd_per_gpu: float
    life_years: float
    power_w: float
    power_from: str  # "profile TDP" or "tier power_w"
    pue: float
    usd_per_kwh: float


def tco_breakdown(tier: Tier, defaults: TcoAssumptions | None = None) -> TcoBreakdown:
    """Amortisation + power (W x PUE x $/kWh) + hosting + operations for an owned tier.

    Assumptions missing from the tier come from ``defaults``, else from the tco_defaults of
    the catalogue the tier was loaded into (the shipped ones for a hand-built Tier).
    Power defaults to the GPU profile's TDP.
    """
    if tier.tco is None:
        raise PriceCatalogueError(f"{tier.gpu}:{tier.name} is not an owned (tco) tier")
    if defaults is None:
        cat = tier._catalogue if tier._catalogue is not None else _shipped()
        defaults = cat.tco_defaults

    def pick(field: str) -> float:
        value = getattr(tier.tco, field) or getattr(defaults, field)
        if value is None:
            raise PriceCatalogueError(
                f"{tier.gpu}:{tier.name}: tco field '{field}' is neither in the tier "
                "nor in tco_defaults"
            )
        return value.value

    capex = tier.tco.capex_usd_per_gpu.value
    life = pick("life_years")
    pue = pick("pue")
    kwh = pick("usd_per_kwh")
    hosting = pick("hosting_usd_per_gpu_hr")
    ops = pick("operations_usd_per_gpu_hr")
    power_override = tier.tco.power_w or defaults.power_w
    if power_override is not None:
        power_w, power_from = power_override.value, "tier power_w"
    else:
        power_w, power_from = gpu_tdp_w(tier.gpu), "profile TDP"
    amortisation = capex / (life * HOURS_PER_YEAR)
    power = power_w * pue / 1000.0 * kwh
    return TcoBreakdown(
        amortisation_usd_per_gpu_hr=amortisation,
        power_usd_per_gpu_hr=power,
        hosting_usd_per_gpu_hr=hosting,
        operations_usd_per_gpu_hr=ops,
        total_usd_per_gpu_hr=amortisation + power + hosting + ops,
        capex_usd_per_gpu=capex,
        life_years=life,
        power_w=power_w,
        power_from=power_from,
        pue=pue,
        usd_per_kwh=kwh,
    )


def price_per_gpu_hour(tier: Tier, catalogue: Catalogue | None = None) -> float:
    """$/GPU-hour of a tier: its price, factor x its base tier, or the computed TCO.

    Derived tiers' base and the TCO defaults come from ``catalogue``, else from the catalogue
    the tier was loaded into, else (a Tier built by hand) the shipped one.
    """
    if tier.price_usd_per_gpu_hr is not None:
        return tier.price_usd_per_gpu_hr
    cat = catalogue if catalogue is not None else tier._catalogue
    if cat is None:
        cat = _shipped()
    if tier.derived is not None:
        base = cat.tier(tier.gpu, tier.derived.from_tier)
        return tier.derived.factor * price_per_gpu_hour(base, cat)
    return tco_breakdown(tier, cat.tco_defaults).total_usd_per_gpu_hr


_SHIPPED: Catalogue | None = None


def price_basis(tier: Tier) -> str:
    """How a tier's price was arrived at, in words: 'quoted', 'derived: 2 x
    neocloud-on-demand', or 'computed: owned TCO ...'. A derived or computed price decides a
    verdict as much as a quoted one, so every headline that uses it says so."""
    if tier.derived is not None:
        return f"derived: {tier.derived.factor:g} x {tier.derived.from_tier}, not quoted"
    if tier.tco is not None:
        return (
            "computed: owned TCO (capex over its life + power x PUE x electricity + hosting + "
            "operations)"
        )
    return "quoted"


def price_decimals(usd_per_gpu_hr: float | None, most: int = 4) -> int:
    """Decimals to show a $/GPU-hour price with, so GPUs x shown price x hours gives the
    $/month shown beside it: 2 for a quoted $2.25, 4 for a derived $1.5456 (shown as $1.55,
    20 GPUs x 730 h read $22,630 against the $22,565 computed). Money is carried at full
    precision everywhere; only its display is rounded."""
    if usd_per_gpu_hr is None:
        return 2
    for d in range(2, most + 1):
        if abs(round(usd_per_gpu_hr, d) - usd_per_gpu_hr) < 5e-7:
            return d
    return most


def price_text(usd_per_gpu_hr: float | None) -> str:
    """'$1.5456', '$12.00': a price per GPU-hour as `price_decimals` shows it."""
    if usd_per_gpu_hr is None:
        return "—"
    return f"${usd_per_gpu_hr:,.{price_decimals(usd_per_gpu_hr)}f}"


def _shipped() -> Catalogue:
    global _SHIPPED
    if _SHIPPED is None:
        _SHIPPED = load_catalogue()
    return _SHIPPED


# --------------------------------------------------------------------------- cost formulas


def _check_count(gpus: int) -> None:
    if isinstance(gpus, bool) or not isinstance(gpus, numbers.Integral) or gpus < 1:
        raise PriceCatalogueError(f"GPU count must be a whole number >= 1, got {gpus!r}")


def _usable(tokens_per_s: float | None) -> bool:
    return tokens_per_s is not None and math.isfinite(tokens_per_s) and tokens_per_s > 0


def dollars_per_mtok(price_per_gpu_hour: float, gpus: int, tokens_per_s: float) -> float | None:
    """(price x GPUs) / (tokens/s x 3600) x 1e6, the DESIGN.md and InferenceX formula.

    ``tokens_per_s`` is the whole deployment's throughput (all ``gpus`` together), output or
    total tokens depending on which $/Mtok is wanted. No throughput (<= 0, NaN) -> None:
    a load point that produced nothing has no cost per token, not an infinite one.
    """
    _check_count(gpus)
    if not math.isfinite(price_per_gpu_hour) or price_per_gpu_hour < 0:
        raise PriceCatalogueError(
            f"price per GPU-hour must be a finite number >= 0, got {price_per_gpu_hour!r}"
        )
    if not _usable(tokens_per_s):
        return None
    return (price_per_gpu_hour * gpus) / (tokens_per_s * SECONDS_PER_HOUR) * 1e6


def _check_utilisation(utilisation: float) -> None:
    if not (math.isfinite(utilisation) and 0 < utilisation <= 1):
        raise PriceCatalogueError(
            f"utilisation must be in (0, 1] (e.g. 0.3 for 30%), got {utilisation!r}"
        )


def cost_at_utilisation(usd_per_mtok: float | None, utilisation: float) -> float | None:
    """$/Mtok of a fleet busy a fraction ``utilisation`` of its paid hours: busy $/Mtok / u.

    The idle hours are paid for and produce nothing, so 30% utilisation costs
    0.85 / 0.30 = 2.83x what 85% does (see ``utilisation_multiple``).
    """
    _check_utilisation(utilisation)
    if usd_per_mtok is None:
        return None
    return usd_per_mtok / utilisation


def cost_error_name(tokens: Literal["output", "total"]) -> str:
    """The throughput whose expected error a simulated $/Mtok of `tokens` carries (a
    Summary.value name, for RunCurve.expected_error).

    $/Mtok is price / throughput (`dollars_per_mtok`), and the price is a catalogue fact with
    no simulator error in it, so a simulated $/Mtok is as uncertain as the throughput it
    divides by, inverted: throughput within tps x/÷ (1 + e) puts $/Mtok within
    price / (tps (1 + e)) .. price (1 + e) / tps, which is $/Mtok x/÷ (1 + e), what
    bench.sim.profiles.accuracy.bounds gives (dividing by the utilisation scales both ends
    alike). Total tokens/s has no quantity of its own, so it gets the largest of the run's
    errors (bench.sim.profiles.accuracy.relative_error). One source for the dashboard's
    cost charts and the exports' ($/Mtok tables, the deck's bars).
    """
    return "output_tokens_per_s" if tokens == "output" else "total_tokens_per_s"


def utilisation_multiple(low: float, high: float) -> float:
    """How many times more a token costs at utilisation ``low`` than at ``high`` (high/low)."""
    _check_utilisation(low)
    _check_utilisation(high)
    return high / low


def joules_per_token(power_w: float, gpus: int, tokens_per_s: float) -> float | None:
    """Energy per token, J = W x GPUs / (tokens/s). None without throughput.

    ``power_w`` is per GPU: the profile TDP by default (an upper bound), measured board
    power when telemetry provides it. Facility overhead (PUE) is not included here.
    """
    _check_count(gpus)
    if not math.isfinite(power_w) or power_w < 0:
        raise PriceCatalogueError(
            f"power per GPU must be a finite number of watts >= 0, got {power_w!r}"
        )
    if not _usable(tokens_per_s):
        return None
    return power_w * gpus / tokens_per_s


def energy_cost_per_mtok(
    power_w: float, gpus: int, tokens_per_s: float, usd_per_kwh: float, pue: float = 1.0
) -> float | None:
    """Electricity cost of a million tokens: J/token x 1e6 x PUE / 3.6e6 J/kWh x $/kWh."""
    if not math.isfinite(usd_per_kwh) or usd_per_kwh < 0:
        raise PriceCatalogueError(f"$/kWh must be a finite number >= 0, got {usd_per_kwh!r}")
    if not math.isfinite(pue) or pue < 1:
        raise PriceCatalogueError(f"PUE must be >= 1, got {pue!r}")
    joules = joules_per_token(power_w, gpus, tokens_per_s)
    if joules is None:
        return None
    return joules * 1e6 * pue / JOULES_PER_KWH * usd_per_kwh


class EnergyEstimate(BaseModel):
    """Energy per token and its electricity cost, with the power figure's provenance."""

    gpu: str
    gpus: int
    power_w: float
    power_from: Literal["profile TDP", "measured"]
    joules_per_token: float | None
    kwh_per_mtok: float | None
    usd_per_kwh: float
    pue: float
    energy_usd_per_mtok: float | None
    note: str | None = None


def energy_estimate(
    gpu: str,
    gpus: int,
    tokens_per_s: float,
    catalogue: Catalogue | None = None,
    measured_power_w: float | None = None,
) -> EnergyEstimate:
    """J/token and electricity $/Mtok: measured power when given, else the profile TDP.

    $/kWh and PUE come from the catalogue's tco_defaults (override them in a prices file).
    """
    cat = catalogue if catalogue is not None else _shipped()
    d = cat.tco_defaults
    kwh = d.usd_per_kwh.value if d.usd_per_kwh else 0.0
    pue = d.pue.value if d.pue else 1.0
    if measured_power_w is not None:
        power, power_from = float(measured_power_w), "measured"
    else:
        power, power_from = gpu_tdp_w(gpu), "profile TDP"
    j = joules_per_token(power, gpus, tokens_per_s)
    return EnergyEstimate(
        gpu=gpu,
        gpus=gpus,
        power_w=power,
        power_from=power_from,
        joules_per_token=j,
        kwh_per_mtok=None if j is None else j * 1e6 / JOULES_PER_KWH,
        usd_per_kwh=kwh,
        pue=pue,
        energy_usd_per_mtok=energy_cost_per_mtok(power, gpus, tokens_per_s, kwh, pue),
        note=None if j is not None else "no throughput: energy per token undefined",
    )


# --------------------------------------------------------------------------- the cost table


class CostRow(BaseModel):
    """$/Mtok of one pricing tier at one measured throughput: what every view shows.

    ``*_usd_per_mtok`` assume the GPUs are busy every paid hour (InferenceX's convention);
    ``*_at_utilisation`` divide by the fleet utilisation; ``idle_multiple`` = 1/utilisation.
    Values are None when there is no throughput or no price (``note`` says why).
    """

    gpu: str
    tier: str
    kind: str
    provider: str
    source: str
    date: str
    price_usd_per_gpu_hr: float | None
    gpus: int
    output_tokens_per_s: float
    total_tokens_per_s: float
    output_usd_per_mtok: float | None
    total_usd_per_mtok: float | None
    utilisation: float
    idle_multiple: float
    output_usd_per_mtok_at_utilisation: float | None
    total_usd_per_mtok_at_utilisation: float | None
    note: str | None = None


def cost_table(
    gpu: str,
    gpus: int,
    output_tokens_per_s: float,
    total_tokens_per_s: float,
    catalogue: Catalogue,
    utilisation: float = 1.0,
) -> list[CostRow]:
    """$/Mtok (output and total tokens) on every tier of ``gpu``, at one measured throughput.

    Throughputs are for the whole deployment of ``gpus`` GPUs (not per GPU). The one
    function the CLI, API, dashboard and exports call, so they all agree.
    """
    _check_count(gpus)
    _check_utilisation(utilisation)
    name = catalogue.resolve_gpu(gpu)
    rows: list[CostRow] = []
    for tier in catalogue.tiers(name):
        notes: list[str] = []
        try:
            price: float | None = price_per_gpu_hour(tier, catalogue)
        except PriceCatalogueError as exc:
            price = None
            notes.append(str(exc))
        out = tot = None
        if price is not None:
            out = dollars_per_mtok(price, gpus, output_tokens_per_s)
            tot = dollars_per_mtok(price, gpus, total_tokens_per_s)
            if out is None:
                notes.append(f"no output throughput ({output_tokens_per_s!r} tokens/s)")
            if tot is None:
                notes.append(f"no total throughput ({total_tokens_per_s!r} tokens/s)")
        rows.append(
            CostRow(
                gpu=name,
                tier=tier.name,
                kind=tier.kind,
                provider=tier.provider,
                source=tier.source,
                date=tier.date,
                price_usd_per_gpu_hr=price,
                gpus=gpus,
                output_tokens_per_s=output_tokens_per_s,
                total_tokens_per_s=total_tokens_per_s,
                output_usd_per_mtok=out,
                total_usd_per_mtok=tot,
                utilisation=utilisation,
                idle_multiple=1.0 / utilisation,
                output_usd_per_mtok_at_utilisation=cost_at_utilisation(out, utilisation),
                total_usd_per_mtok_at_utilisation=cost_at_utilisation(tot, utilisation),
                note="; ".join(notes) or None,
            )
        )
    return rows
