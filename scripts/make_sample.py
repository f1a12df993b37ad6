#!/usr/bin/env python3
"""Generate the bundled synthetic English relation-classification sample dataset.

Sentences are rendered from hand-written templates filled with hand-written
(fictional or public-domain geographic) entity names; nothing is downloaded.
Output: ``train.csv``, ``valid.csv``, ``test.csv`` and ``relation.txt`` (label
order, one per line) in ``--out``.  Every row satisfies
``sentence[off:off + len(entity)] == entity`` for head and tail.

Template syntax: ``{h}``/``{t}`` are the head/tail mentions whose offsets are
recorded; ``{H}``/``{T}`` repeat the same string without being recorded (hard
cases where the string occurs twice); ``{hc}``/``{tc}`` are the country of the
head/tail city; ``{person}``, ``{org}``, ``{city}``, ``{country}``, ``{book}``,
``{univ}`` (optionally numbered, e.g. ``{person2}``) are distractor entities
distinct from every other entity in the sentence; the rest are fillers.  Lines
starting with ``*`` are held out of train (they appear only in valid/test), and
20% of every entity pool is likewise only used in valid/test.
"""

from __future__ import annotations

import argparse
import csv
import random
import re
from collections.abc import Callable
from itertools import product
from pathlib import Path

HEADER = ["id", "sentence", "head", "head_offset", "tail", "tail_offset", "relation", "head_type", "tail_type"]
NEGATIVE = "no_relation"
SPLIT_SIZES = {"train": 3000, "valid": 500, "test": 500}
NEGATIVE_SHARE = 0.22
EVAL_ONLY_ENTITY_SHARE = 0.2
DEFAULT_OUT = Path(__file__).resolve().parents[1] / "nre_ray" / "data" / "sample"


def _items(text: str) -> list[str]:
    """Split a ``;``-separated literal into stripped, non-empty items."""
    return [" ".join(item.split()) for item in text.split(";") if item.strip()]


def _pairs(text: str) -> dict[str, str]:
    """Parse ``city=country; ...`` into a dict."""
    return dict(item.split("=") for item in _items(text))


FIRST = _items("""Alice; Jean-Luc; Mary-Kate; Priya; Kwame; Sofia; Hiroshi; Olga; Mateo; Fatima; Liam; Aisha; Björn;
    Zoe; Rahul; Ingrid; Diego; Amara; Tomasz; Yuki; Noah; Leila; Ana-Maria; Gustavo; Hannah; Omar; Mei; Pierre;
    Nadia; Samuel; Elif; Kofi; Lucía; Arjun; Freya; Dmitri; Grace; Tariq; Wen; Jo-Ann""")
LAST = _items("""Chen; O'Brien; Nakamura; Okafor; García; Müller; Smith-Jones; Kowalski; Haddad; Rossi; Dubois;
    Patel; Andersen; Ivanova; Mensah; Kim; Johansson; Santos; Van der Berg; McAllister; da Silva; Nguyen; Fischer;
    Al-Rashid; Lindqvist; Moreau; Adeyemi; Costa; Novak; Schmidt; Herrera; Yilmaz; Tanaka; Kaur; Jensen; Walsh;
    Petrov; Ortiz; Becker; St. Clair""")
ORG_STEMS = _items("""Acme; Globex; Initech; Northwind; Contoso; Fabrikam; Bluefin; Redwood; Silverline;
    Quantum Leaf; Orbital; Brightpath; Ironbark; Kestrel; Lumen; Meridian; Nimbus; Oakridge; Pinecone; Helix;
    Zephyr; Vantage; Cobalt; Tidewater; Sunspire; Granite Peak; Polaris; Arrowhead; Blue-Sky; Tri-State;
    Hi-Fidelity; Maple & Finch; Copperfield; Stellar; Harborview; Nova""")
ORG_SUFFIXES = _items("""Corp.; Inc.; Labs; Systems; Holdings; Group; Analytics; Robotics; Foods; Energy; Media;
    Bank; Ltd.; Technologies; Motors; Pharma; & Co.; Logistics""")
CAPITALS = _pairs("""Paris=France; Berlin=Germany; Madrid=Spain; Rome=Italy;
    Lisbon=Portugal; London=United Kingdom; Dublin=Ireland; Ottawa=Canada; Washington, D.C.=United States;
    Mexico City=Mexico; Buenos Aires=Argentina; Brasília=Brazil; Bogotá=Colombia; Lima=Peru; Santiago=Chile;
    Canberra=Australia; Wellington=New Zealand; Tokyo=Japan; Seoul=South Korea; Beijing=China; New Delhi=India;
    Islamabad=Pakistan; Kuala Lumpur=Malaysia; Hanoi=Vietnam; Bangkok=Thailand; Phnom Penh=Cambodia;
    Jakarta=Indonesia; Manila=Philippines; Cairo=Egypt; Nairobi=Kenya; Addis Ababa=Ethiopia; Abuja=Nigeria;
    Accra=Ghana; Dakar=Senegal; Rabat=Morocco; Pretoria=South Africa; Ankara=Turkey; Athens=Greece; Vienna=Austria;
    Bern=Switzerland; Amsterdam=Netherlands; Brussels=Belgium; Stockholm=Sweden; Oslo=Norway; Helsinki=Finland;
    Copenhagen=Denmark; Warsaw=Poland; Prague=Czechia; Budapest=Hungary; Port-au-Prince=Haiti;
    San José=Costa Rica; St. John's=Antigua and Barbuda; Abu Dhabi=United Arab Emirates; Astana=Kazakhstan;
    Reykjavík=Iceland; Kyiv=Ukraine; Tallinn=Estonia; Ulaanbaatar=Mongolia; Kathmandu=Nepal; Doha=Qatar;
    Havana=Cuba; Yamoussoukro=Côte d'Ivoire""")
NON_CAPITALS = _pairs("""Sydney=Australia; Melbourne=Australia; Istanbul=Turkey;
    Toronto=Canada; Vancouver=Canada; Montréal=Canada; Zurich=Switzerland; Geneva=Switzerland; Lagos=Nigeria;
    São Paulo=Brazil; Rio de Janeiro=Brazil; Mumbai=India; Bengaluru=India; Shanghai=China; New York=United States;
    Los Angeles=United States; St. Louis=United States; Winston-Salem=United States; Ann Arbor=United States;
    Salt Lake City=United States; Milan=Italy; Munich=Germany; Hamburg=Germany; Frankfurt am Main=Germany;
    Barcelona=Spain; Lyon=France; Marseille=France; Aix-en-Provence=France; Saint-Étienne=France;
    Stoke-on-Trent=United Kingdom; Manchester=United Kingdom; Osaka=Japan; Casablanca=Morocco; Almaty=Kazakhstan;
    Karachi=Pakistan; Auckland=New Zealand; Johannesburg=South Africa; Ho Chi Minh City=Vietnam; Porto=Portugal;
    Kraków=Poland; Gothenburg=Sweden; Rotterdam=Netherlands; Antwerp=Belgium; Guadalajara=Mexico; Medellín=Colombia;
    Córdoba=Argentina; Busan=South Korea; Dubai=United Arab Emirates; Alexandria=Egypt; Cork=Ireland""")
COUNTRY_OF = {**CAPITALS, **NON_CAPITALS}
# Names that take "the" ("the [Netherlands]", "the [University of Lyon]"); the article stays outside the span.
THE_COUNTRIES = set(_items("United States; United Kingdom; United Arab Emirates; Netherlands; Philippines"))
BOOK_ADJ = _items("""Silent; Last; Hidden; Broken; Golden; Distant; Forgotten; Crimson; Quiet; Burning; Hollow;
    Endless; Painted; Winter; Glass; Iron; Secret; Wandering; Paper; Midnight""")
BOOK_NOUN = _items("""River; Garden; Kingdom; Lighthouse; Orchard; Harbor; Mirror; Station; Archive; Map; Violin;
    Horizon; Cartographer; Daughter; Season; Bridge; Empire; Tide; Lantern; Letter""")
EXTRA_BOOKS = _items("""Dr. Finch's Garden; Twenty-One Winters; Notes from St. Ives; A Map of Small Hours;
    The Salt-Water Years; Mrs. Pemberton Regrets; Ode to the North; What the Heron Knew; Seven Days in Port Elspeth;
    The Long Way Home""")
UNIV_EXTRA = _items("""Ridgeway University; Northfield College; St. Andrew's College; Carnegie Polytechnic;
    Westbrook Institute of Technology; Lakeside University; Hollins-Marsh College; Eastgate School of Economics;
    Pacific Rim University; Queen's College; Mount Alder University; Riverside Conservatory""")
JOBS = _items("""engineer; data scientist; product manager; accountant; lawyer; designer; analyst; researcher;
    economist; architect; editor; sales director; actuary""")
SUBJECTS = _items("""physics; economics; computer science; history; law; medicine; chemistry; philosophy;
    mathematics; linguistics; architecture; biology""")
MONTHS = _items("January; February; March; April; May; June; July; August; September; October; November; December")

# (relation, head type, tail type) -> templates; "*" marks templates held out of train.
TEMPLATES: dict[tuple[str, str, str], str] = {
    ("founded_by", "org", "person"): """
{h} was founded by {t} in {year}.
{t} founded {h} in {year}.
{t}, who founded {h}, stepped down as chief executive in {year}.
{h}'s founder, {t}, spoke at a conference in {city}.
In {year}, {t} started {h} out of a garage in {city}.
{h} (founded by {t}) now employs more than {num} people.
"We never expected this," said {t}, the founder of {h}.
{t} founded {h} in {year}; today {H} is valued at billions.
{h}, which {t} established in {year}, was acquired by {org}.
Before starting {h}, {t} worked for {org} for a decade.
* The company {h} was set up by {t} shortly after {year}.
* Asked about {H}, {t} recalled founding {h} with two employees.""",
    ("born_in", "person", "city"): """
{h} was born in {t} in {year}.
{h} was born in {t}, {tc}.
Born in {t}, {h} moved to {city} as a teenager.
{t} is the birthplace of {h}.
{h}, a native of {t}, joined {org} in {year}.
{h} (born {year} in {t}) is {ajob}.
The {job} {h} was born and raised in {t}.
{t}-born {h} won the award in {year}.
{h} has lived in {city} for years but was born in {t}.
{h} was born on {month} {day}, {year}, in {t}.
In interviews, {H} rarely mentions that {h} was born in {t}.
* It was in {t} that {h} was born.
* Records show that {h}'s birthplace was {t}, not {city}.""",
    ("capital_of", "capital", "its_country"): """
{h} is the capital of {t}.
{h} is the capital city of {t}.
The capital of {t} is {h}.
{t}'s capital, {h}, hosted a summit in {year}.
{h}, the capital of {t}, has about {num} registered cars.
In {year}, the government of {t} moved several ministries back to {h}, the capital.
{h} (capital of {t}) was the venue for talks with {country}.
Delegates from {country} arrived in {h}, capital of {t}, on {month} {day}.
{t} has had {h} as its capital since at least {year}.
As the capital of {t}, {h} is home to the national parliament.
* The national government of {t} sits in its capital, {h}.
* Tourists visiting {t} in {month} usually start in the capital, {h}.""",
    ("works_for", "person", "org"): """
{h} works for {t}.
{h} works at {t} as {ajob}.
{h} is {ajob} at {t}.
{t} hired {h} as {ajob} in {year}.
{h}, {ajob} at {t}, declined to comment.
"{h} has been with {t} for {small} years," a spokesperson said.
{t}'s {job} {h} presented the results in {city}.
{h} joined {t} in {year} after graduating from {univ}.
{h} left {org} in {year} to work for {t}.
According to {person}, {h} is employed by {t} in {city}.
* {h} currently serves as {ajob} for {t}.
* An employee of {t}, {h} spoke at {univ} last {month}.""",
    ("headquartered_in", "org", "city"): """
{h} is headquartered in {t}.
{h} is based in {t}, {tc}.
{h} has its headquarters in {t}.
{t}-based {h} reported record profits in {year}.
{h}, headquartered in {t}, opened an office in {city} in {year}.
{t} is home to the headquarters of {h}.
{h} moved its head office from {city} to {t} in {year}.
{h}'s headquarters are located in {t}.
{T} officials welcomed {h}, which has been headquartered in {t} since {year}.
Founded by {person}, {h} is based in {t}.
From its head office in {t}, {h} manages over {num} stores.
* {h} (HQ: {t}) announced layoffs on {month} {day}.
* Workers gathered in {t}, where {h} has its headquarters.""",
    ("written_by", "book", "person"): """
{h} was written by {t}.
{t} wrote {h} in {year}.
"{h}" is a novel by {t}.
{t}'s novel {h} won a major prize in {year}.
{h}, the debut novel of {t}, was published in {year}.
{t} is the author of "{h}".
{h} (by {t}) was adapted into a film by {person}.
In {h}, {t} tells the story of a family in {city}.
{person} reviewed {h}, the latest book by {t}.
{t} spent {small} years writing {h}.
* Written by {t}, {h} sold {num} copies in its first year.
* The author of "{h}", {t}, lives in {city}.""",
    ("spouse_of", "person", "person"): """
{h} is married to {t}.
{h} married {t} in {year}.
{h} and {t} got married in {city} in {year}.
{h}'s spouse, {t}, is {ajob}.
{t} and {h} have been married since {year}.
{h}, who is married to {t}, works at {org}.
{h} attended the gala in {city} with their spouse, {t}.
{t} wed {h} in a small ceremony in {city}.
Friends of {H} say {h} has been married to {t} since {year}.
The married couple {h} and {t} live in {city}.
{h} introduced {person} to {t}, their spouse of {small} years.
* {t}, the spouse of {h}, declined to comment.
* After {small} years of marriage, {h} and {t} renewed their vows.""",
    ("educated_at", "person", "univ"): """
{h} graduated from {t} in {year}.
{h} studied {subject} at {t}.
{h} earned a degree in {subject} from {t}.
{t} graduate {h} now works at {org}.
{h}, who studied at {t}, later moved to {city}.
After earning a PhD at {t}, {h} joined {org}.
{h} received a {subject} degree from {t} in {year}.
{t} awarded {h} a doctorate in {subject} in {year}.
{h} attended {t} before founding {org}.
Among the graduates of {t} is {h}, {ajob} from {city}.
* {h} holds a master's degree from {t}.
* As a student at {t}, {h} studied {subject} under {person}.""",
    (NEGATIVE, "person", "city"): """
{h} visited {t} last {month}.
{h} spent a week in {t} on vacation.
{h} gave a talk in {t} on {month} {day}.
{h}, who was born in {city}, flew to {t} for a conference.
* {h} has never been to {t}.""",
    (NEGATIVE, "org", "person"): """
{t} criticized {h}'s latest product.
{t} was interviewed about {h} by {person}.
{h} sent {t} a complimentary sample.
* {t} wrote a critical article about {h}.""",
    (NEGATIVE, "person", "org"): """
{h} bought shares of {t}.
{h} sued {t} over a contract dispute.
{h} interviewed for a job at {t} but turned it down.
* {h}, who works for {org}, is a loyal customer of {t}.""",
    (NEGATIVE, "city", "country"): """
Flights from {h} to {t} were cancelled because of fog.
The mayor of {h} visited {t} in {year}.
{h} signed a twinning agreement with a town in {t}.
* Exports from {t} reach {h} by rail.""",
    (NEGATIVE, "noncapital", "its_country"): """
{h} is the largest city in {t}, but it is not the capital.
{h} is a major port in {t}.
With {num} students, {h} is a university town in {t}.
* Many people assume {h} is the capital of {t}, but it is not.""",
    (NEGATIVE, "org", "city"): """
{h} opened a temporary pop-up store in {t}.
{h} sponsored a marathon in {t} in {year}.
{h}, headquartered in {city}, opened a small shop in {t}.
* {h} is considering an expansion into {t}.""",
    (NEGATIVE, "book", "person"): """
{t} reviewed {h} for {org}.
{t} read {h} on the train to {city}.
{h}, which {person} wrote, was a favourite of {t}.
* {t} criticized "{h}" on a podcast.""",
    (NEGATIVE, "person", "person"): """
{h} met {t} at a conference in {city}.
{h} and {t} were both born in {year}.
{h} debated {t} on live television.
Colleagues of {T} say {h} met {t} only once, in {city}.
{h} thanked {t}, a colleague at {org}, for the help.
* {h} and {t} co-authored a paper on {subject}.""",
    (NEGATIVE, "person", "univ"): """
{h} gave a guest lecture at {t}.
{h} applied to {t} but was rejected.
{h} donated ${num} to {t}.
* {h} toured {t} with {person}.""",
    (NEGATIVE, "org", "org"): """
{h} and {t} signed a partnership deal in {year}.
{h} sued {t} over a patent.
{t} lost a major contract to {h}.
* {h} acquired a small stake in {t}.""",
}
TYPE_NAME = {"capital": "city", "noncapital": "city", "its_country": "country"}
PLACEHOLDER = re.compile(r"\{(\w+)\}")
Filler = Callable[[random.Random], str]
FILLERS: dict[str, Filler] = {
    "year": lambda r: str(r.randint(1950, 2022)),
    "num": lambda r: f"{r.randint(200, 95000):,}",
    "small": lambda r: str(r.randint(2, 30)),
    "day": lambda r: str(r.randint(1, 28)),
    "month": lambda r: r.choice(MONTHS),
    "job": lambda r: r.choice(JOBS),
    "ajob": lambda r: _with_article(r.choice(JOBS)),
    "subject": lambda r: r.choice(SUBJECTS),
}


def _with_article(word: str) -> str:
    """Prefix ``word`` with the indefinite article 'a' or 'an'."""
    return ("an " if word[0] in "aeiou" else "a ") + word


def entity_pools() -> dict[str, list[str]]:
    """Return the full (sorted, de-duplicated) name list for each entity type."""
    people = []
    for i, (first, last) in enumerate(product(FIRST, LAST)):
        middle = f" {chr(65 + i % 26)}." if i % 7 == 3 else ""
        people.append(f"{first}{middle} {last}")
    books = [f"The {a} {n}" for a, n in product(BOOK_ADJ, BOOK_NOUN)]
    books += [f"{a} {n}s" for a, n in product(BOOK_ADJ, BOOK_NOUN)] + EXTRA_BOOKS
    univs = [f"University of {c}" for c in list(NON_CAPITALS)[::2]] + UNIV_EXTRA
    orgs = [f"{s} {x}" for s, x in product(ORG_STEMS, ORG_SUFFIXES)]
    places = {"capital": [*CAPITALS], "noncapital": [*NON_CAPITALS], "city": [*COUNTRY_OF]}
    pools = {"person": people, "org": orgs, **places, "country": [*COUNTRY_OF.values()], "book": books, "univ": univs}
    return {kind: sorted(set(names)) for kind, names in pools.items()}


def split_pools(pools: dict[str, list[str]], rng: random.Random) -> dict[str, dict[str, list[str]]]:
    """Hold out a share of every pool: train sees 80%, valid/test see all names."""
    train: dict[str, list[str]] = {}
    for kind, names in pools.items():
        shuffled = names[:]
        rng.shuffle(shuffled)
        train[kind] = sorted(shuffled[: round(len(names) * (1 - EVAL_ONLY_ENTITY_SHARE))])
    return {"train": train, "valid": pools, "test": pools}


def parse_templates(split: str) -> dict[str, list[tuple[str, str, str]]]:
    """Return label -> [(head type, tail type, template)] usable in ``split``."""
    out: dict[str, list[tuple[str, str, str]]] = {}
    for (label, htype, ttype), block in TEMPLATES.items():
        for line in block.strip().splitlines():
            held_out = line.startswith("* ")
            if held_out and split == "train":
                continue
            template = line[2:] if held_out else line
            names = PLACEHOLDER.findall(template)
            assert names.count("h") == 1 and names.count("t") == 1, template
            out.setdefault(label, []).append((htype, ttype, template))
    return out


def sample_pair(rng: random.Random, pools: dict[str, list[str]], htype: str, ttype: str) -> tuple[str, str]:
    """Sample (head, tail) strings of the given types; city/country pairs are consistent."""
    head = rng.choice(pools[htype])
    if ttype == "its_country":
        return head, COUNTRY_OF[head]
    while True:
        tail = rng.choice(pools[ttype])
        if tail != head and not (ttype == "country" and tail == COUNTRY_OF.get(head)):
            return head, tail


def render(template: str, values: dict[str, str]) -> tuple[str, int, int]:
    """Fill ``template``; return (sentence, offset of ``{h}``, offset of ``{t}``)."""
    parts: list[str] = []
    offsets: dict[str, int] = {}
    pos = 0
    for match in PLACEHOLDER.finditer(template):
        name, value = match.group(1), values[match.group(1)]
        parts.append(template[pos : match.start()])
        if (value in THE_COUNTRIES or value.startswith("University of")) and name not in ("hc", "tc"):
            parts.append("the " if "".join(parts).strip() else "The ")  # "Lyon, France" stays article-free
        offsets[name] = sum(map(len, parts))
        parts.append(value)
        pos = match.end()
    sentence = "".join([*parts, template[pos:]])
    # "... Acme Inc.." -> "... Acme Inc." (the entity keeps its own final period).
    return sentence[:-1] if sentence.endswith("..") else sentence, offsets["h"], offsets["t"]


def make_row(rng: random.Random, pools: dict[str, list[str]], label: str, spec: tuple[str, str, str]) -> list[str]:
    """Render one example of ``label`` from a (head type, tail type, template) spec."""
    htype, ttype, template = spec
    head, tail = sample_pair(rng, pools, htype, ttype)
    values = {"h": head, "t": tail, "H": head, "T": tail}
    values["hc"], values["tc"] = COUNTRY_OF.get(head, ""), COUNTRY_OF.get(tail, "")
    used = {head, tail, values["hc"], values["tc"]}
    for name in PLACEHOLDER.findall(template):
        base = name.rstrip("0123456789")
        if name in values:
            continue
        if base in FILLERS:
            values[name] = FILLERS[base](rng)
            continue
        choice = rng.choice(pools[base])
        while choice in used:
            choice = rng.choice(pools[base])
        used.add(choice)
        values[name] = choice
    sentence, h_off, t_off = render(template, values)
    for entity, offset in ((head, h_off), (tail, t_off)):
        if sentence[offset : offset + len(entity)] != entity:  # an explicit check: survives ``python -O``
            raise AssertionError(f"offset {offset} of {entity!r} is wrong in {sentence!r}")
    types = TYPE_NAME.get(htype, htype), TYPE_NAME.get(ttype, ttype)
    return [sentence, head, str(h_off), tail, str(t_off), label, *types]


def class_counts(n_rows: int, labels: list[str]) -> dict[str, int]:
    """Stratified per-class counts: ``NEGATIVE_SHARE`` negatives, positives evenly."""
    n_neg = round(n_rows * NEGATIVE_SHARE)
    positives = [lab for lab in labels if lab != NEGATIVE]
    base, extra = divmod(n_rows - n_neg, len(positives))
    return {**{lab: base + (i < extra) for i, lab in enumerate(positives)}, NEGATIVE: n_neg}


def generate(seed: int) -> tuple[list[str], dict[str, list[list[str]]]]:
    """Build all splits; sentences are unique across the whole dataset."""
    rng = random.Random(seed)
    labels = [NEGATIVE, *dict.fromkeys(k[0] for k in TEMPLATES if k[0] != NEGATIVE)]
    pools_by_split = split_pools(entity_pools(), rng)
    seen: set[str] = set()
    splits: dict[str, list[list[str]]] = {}
    for split, n_rows in SPLIT_SIZES.items():
        specs = parse_templates(split)
        rows: list[list[str]] = []
        for label, count in class_counts(n_rows, labels).items():
            missing, attempts = count, 0
            while missing:
                attempts += 1
                if attempts > 500 * count:
                    raise RuntimeError(f"could not make {count} unique {label} rows for {split}")
                row = make_row(rng, pools_by_split[split], label, rng.choice(specs[label]))
                if row[0] not in seen:  # sentences are unique across all splits
                    seen.add(row[0])
                    rows.append(row)
                    missing -= 1
        rng.shuffle(rows)
        splits[split] = [[f"{split}-{i:05d}", *row] for i, row in enumerate(rows)]
    return labels, splits


def write(out_dir: Path, labels: list[str], splits: dict[str, list[list[str]]]) -> None:
    """Write ``<split>.csv`` files and ``relation.txt`` into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for split, rows in splits.items():
        with open(out_dir / f"{split}.csv", "w", encoding="utf-8", newline="") as f:
            writer = csv.writer(f, lineterminator="\n", quoting=csv.QUOTE_MINIMAL)
            writer.writerow(HEADER)
            writer.writerows(rows)
    (out_dir / "relation.txt").write_bytes(("\n".join(labels) + "\n").encode("utf-8"))


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output dir (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=13, help="random seed (default: 13)")
    args = parser.parse_args(argv)
    labels, splits = generate(args.seed)
    write(args.out, labels, splits)
    for split, rows in splits.items():
        print(f"{split}: {len(rows)} rows -> {args.out / (split + '.csv')}")


if __name__ == "__main__":
    main()
